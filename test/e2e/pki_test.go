//go:build e2e && linux

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files of the throwaway cluster PKI, generated in Go at start.
type pki struct {
	CAFile, ServingCert, ServingKey string
	SAPub, SAKey                    string
	TokenFile                       string
	AdminToken, KubeletToken        string
	NodeTokens                      map[string]string // node name → kubelet token (KubeletToken is the first node's)
	// The users system:kube-controller-manager and system:kube-scheduler, which
	// the API server's bootstrap RBAC policy knows (TestStartupTaint's Node,RBAC).
	ControllerManagerToken, SchedulerToken string
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func randToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newPKI writes a CA, an API server serving certificate (SANs 127.0.0.1, localhost,
// kubernetes.default...), an RSA service-account key pair and a static token file with
// an admin token (system:masters), a token each for kube-controller-manager and
// kube-scheduler, and a kubelet token (system:node:NODE) for each node name (the
// first one's is KubeletToken).
func newPKI(dir string, nodeNames ...string) (*pki, error) {
	if len(nodeNames) == 0 {
		return nil, fmt.Errorf("newPKI: no node name")
	}
	nodeName := nodeNames[0]
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{
		CAFile:      filepath.Join(dir, "ca.crt"),
		ServingCert: filepath.Join(dir, "apiserver.crt"),
		ServingKey:  filepath.Join(dir, "apiserver.key"),
		SAPub:       filepath.Join(dir, "sa.pub"),
		SAKey:       filepath.Join(dir, "sa.key"),
		TokenFile:   filepath.Join(dir, "tokens.csv"),
		AdminToken:  randToken(),
		NodeTokens:  map[string]string{},

		ControllerManagerToken: randToken(),
		SchedulerToken:         randToken(),
	}
	for _, n := range nodeNames {
		p.NodeTokens[n] = randToken()
	}
	p.KubeletToken = p.NodeTokens[nodeName]
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ephemera-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	if err := writePEM(p.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local", nodeName},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.ServingCert, "CERTIFICATE", srvDER); err != nil {
		return nil, err
	}
	srvKeyDER, _ := x509.MarshalECPrivateKey(srvKey)
	if err := writePEM(p.ServingKey, "EC PRIVATE KEY", srvKeyDER); err != nil {
		return nil, err
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.SAKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return nil, err
	}
	pubDER, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err := writePEM(p.SAPub, "PUBLIC KEY", pubDER); err != nil {
		return nil, err
	}

	// token,user,uid,"group1,group2"
	tokens := p.AdminToken + `,admin,admin,"system:masters"` + "\n"
	tokens += p.ControllerManagerToken + ",system:kube-controller-manager,kube-controller-manager\n"
	tokens += p.SchedulerToken + ",system:kube-scheduler,kube-scheduler\n"
	for _, n := range nodeNames {
		tokens += p.NodeTokens[n] + ",system:node:" + n + ",kubelet-" + n + `,"system:nodes"` + "\n"
	}
	if err := os.WriteFile(p.TokenFile, []byte(tokens), 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

// kubeconfig returns a kubeconfig for server with a bearer token.
func (p *pki) kubeconfig(server, user, token string) string {
	return `apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: ` + server + `
    certificate-authority: ` + p.CAFile + `
users:
- name: ` + user + `
  user:
    token: ` + token + `
contexts:
- name: e2e
  context: {cluster: e2e, user: ` + user + `}
current-context: e2e
`
}
