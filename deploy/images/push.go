package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// runPush pushes the layout's image index (every platform image and SBOM) to a
// registry under a tag, with the credentials of ~/.docker/config.json (or none).
func runPush(args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	dir := fs.String("layout", "", "the OCI layout make image wrote")
	to := fs.String("to", "", "REPOSITORY:TAG to push to, e.g. registry.example.com/ephemera-scratch:v0.1.0")
	insecure := fs.Bool("insecure", false, "plain HTTP (a registry on loopback)")
	caFile := fs.String("ca-file", "", "PEM certificates to trust for the registry's TLS, beside the system's (a private registry's CA)")
	_ = fs.Parse(args)
	if *dir == "" || *to == "" {
		return errors.New("push: -layout and -to are required")
	}
	var opts []name.Option
	if *insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.NewTag(*to, opts...)
	if err != nil {
		return err
	}
	lp, err := layout.FromPath(*dir)
	if err != nil {
		return err
	}
	top, err := lp.ImageIndex()
	if err != nil {
		return err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return err
	}
	if len(m.Manifests) != 1 {
		return fmt.Errorf("%s: %d entries in index.json, want the one index make image writes", *dir, len(m.Manifests))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return err
	}
	ropts := []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	if *caFile != "" {
		tr, err := transportTrusting(*caFile)
		if err != nil {
			return err
		}
		ropts = append(ropts, remote.WithTransport(tr))
	}
	if err := remote.WriteIndex(ref, idx, ropts...); err != nil {
		return err
	}
	fmt.Printf("pushed %s@%s\n", ref, m.Manifests[0].Digest)
	return nil
}

// transportTrusting is the default transport with the certificates of caFile
// added to the system's roots.
func transportTrusting(caFile string) (http.RoundTripper, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("-ca-file %s: no PEM certificate in it", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return tr, nil
}
