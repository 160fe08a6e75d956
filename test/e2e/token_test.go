//go:build e2e && linux

package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

// The example driver TestTokenRotation runs, and what its CSIDriver requests.
const (
	tokenfileDir    = "examples/tokenfile"
	tokenfileDriver = "tokenfile.csi.ephemera.dev" // driverName in examples/tokenfile/main.go
	tokenAudience   = "ephemera-e2e-audience"
	// The audience the test switches tokenRequests to, to make a refresh fail.
	tokenOtherAudience = "ephemera-e2e-other"
	// The API server's minimum expirationSeconds. The kubelet fetches a new token
	// only after 80% of it (8 min), or when its cache is empty (a restart).
	tokenTTL = 600
	tokenNS  = "e2e-token"
)

// TestTokenRotation runs examples/tokenfile with its own CSIDriver
// (examples/tokenfile/csidriver.yaml: requiresRepublish, tokenRequests set to
// one test audience for 600 s) and examples/tokenfile/pod.yaml, and follows the
// pod's token file through the kubelet's republishes:
//
//  1. first publish: the container reads a token for the audience, bound to
//     the pod and its service account (JWT claims, and the API server's
//     TokenReview accepts it for that audience and not for its own);
//  2. a failing refresh: tokenRequests switched to another audience, the next
//     periodic republish brings no token for the pod's audience, tokenfile
//     refuses it (ephemera_refresh_total{result="failed"}), the kubelet gets
//     the refusal with a retryable code (Unavailable: issue 44, a refused
//     refresh is never answered OK), and the container still reads the last
//     good token from the same mount;
//  3. recovery: tokenRequests restored, the next periodic republish succeeds
//     (ephemera_refresh_total{result="ok"}) with the kubelet's cached token,
//     which is still the first one (less than 80% of its TTL has passed);
//  4. rotation: a kubelet restart empties its token cache; its re-sent
//     NodePublishVolume carries a new token (other jti, later iat), which the
//     running container reads from the same mount (same mount ID in its
//     /proc/self/mountinfo, one mount at the target on the node).
//
// No token text appears in the driver's log.
func TestTokenRotation(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd {
		t.Skip("reads the token file and mountinfo inside a running container: EPHEMERA_E2E_RUNTIME=containerd")
	}
	requireDriver(t) // the scratch driver runs too, as in every other test
	ctx := context.Background()
	tr := c.startTokenfile(t, "tokenfile", false)
	d, pod, sa, h, tokenPath, sameMount := tr.d, tr.pod, tr.sa, tr.h, tr.tokenPath, tr.sameMount

	// 1. The first token.
	tok1 := c.readToken(t, pod, tokenPath)
	cl1 := c.checkToken(t, tok1, pod, sa)
	t.Logf("first token: iat %d, exp %d, jti %s", cl1.Iat, cl1.Exp, cl1.Jti)

	// 2. A failing refresh: tokenRequests no longer lists the pod's audience.
	// The CSIDriver is only read on (re)publish, through the kubelet's informer.
	tFail := time.Now()
	since := d.logSize()
	m0 := d.mustScrape(t)
	c.setTokenRequests(t, tokenOtherAudience)
	refused := regexp.MustCompile(`the kubelet sent no token for audience \\?"` + regexp.QuoteMeta(tokenAudience))
	c.waitLogLine(t, d, since, h, refused, 45*time.Second)
	t.Logf("failing refresh %v after tokenRequests changed", time.Since(tFail).Round(time.Millisecond))
	m1 := d.mustScrape(t)
	if n := refreshes(m1, "failed") - refreshes(m0, "failed"); n < 1 {
		t.Errorf("ephemera_refresh_total{result=\"failed\"} rose by %v, want >= 1", n)
	}
	// The republish is answered with the refusal and a retryable code: the
	// kubelet records it on the pod and retries (issue 44).
	c.waitLogLine(t, d, since, h, regexp.MustCompile(`"Request failed".*code="?Unavailable`), 45*time.Second)
	for _, l := range d.failedLines(since, h) {
		if !regexp.MustCompile(`code="?Unavailable`).MatchString(l) {
			t.Errorf("the republish without the token was answered with another code than Unavailable (the volume is live: the code must be retryable):\n%s", l)
		}
	}
	if tok := c.readToken(t, pod, tokenPath); tok != tok1 {
		t.Errorf("after a failing refresh the container reads another token than the last good one")
	}
	sameMount("after the failing refresh")

	// 3. Recovery: the audience listed again; the next periodic republish
	// succeeds, with the token the kubelet still has cached.
	tOK := time.Now()
	since = d.logSize()
	c.setTokenRequests(t, tokenAudience)
	c.waitLogLine(t, d, since, h, regexp.MustCompile(`"Republished volume with refreshed content"`), 45*time.Second)
	t.Logf("successful refresh %v after tokenRequests was restored", time.Since(tOK).Round(time.Millisecond))
	if n := refreshes(d.mustScrape(t), "ok") - refreshes(m1, "ok"); n < 1 {
		t.Errorf("ephemera_refresh_total{result=\"ok\"} rose by %v, want >= 1", n)
	}
	if tok := c.readToken(t, pod, tokenPath); tok != tok1 {
		t.Errorf("the kubelet's cached token changed before 80%% of its TTL")
	}
	sameMount("after the refresh recovered")

	// 4. Rotation: a restarted kubelet has an empty token cache; the
	// NodePublishVolume it re-sends for the running pod carries a new token.
	tok2 := c.rotateByKubeletRestart(ctx, t, tr, tok1, cl1, func(since int64) {
		if n := len(d.rpcLines(since, "NodePublishVolume", h)); n < 1 {
			t.Errorf("no NodePublishVolume after the kubelet restart, yet the token changed")
		}
	})

	// Every NodePublishVolume of the volume, for the record (the cadence of
	// requiresRepublish is the kubelet's pod resync: syncFrequency plus jitter).
	calls := d.rpcLines(0, "NodePublishVolume", h)
	var at []string
	for _, l := range calls {
		if len(l) > 21 {
			at = append(at, l[6:21]) // klog's "Immdd hh:mm:ss.uuuuuu"
		}
	}
	t.Logf("%d NodePublishVolume calls for the volume at %s", len(calls), strings.Join(at, ", "))
	log := d.log()
	for i, tok := range []string{tok1, tok2} {
		if strings.Contains(log, tok) || strings.Contains(log, strings.SplitN(tok, ".", 3)[2]) {
			t.Errorf("token %d appears in the driver's log %s", i+1, d.logPath)
		}
	}
	c.step("token rotation (failing refresh, recovery, kubelet restart)", tFail)
}

// TestTokenInSecrets is TestTokenRotation with the CSIDriver's
// spec.serviceAccountTokenInSecrets: true (Kubernetes 1.35 beta, on by default;
// GA in 1.36): the kubelet puts csi.storage.k8s.io/serviceAccount.tokens in
// NodePublishVolume's secrets instead of its volume_context
// (pkg/volume/csi/csi_mounter.go), and tokenfile reads it from there.
//
//  1. first publish: every NodePublishVolume of the volume carries secrets (the
//     pod names no nodePublishSecretRef, so they are the token's) and no
//     serviceAccount.tokens key in its volume_context, as the driver's
//     sanitized request log shows (protosanitizer replaces the secrets map as a
//     whole); the container reads a token for the audience, bound to the pod
//     (claims and TokenReview, as TestTokenRotation checks them);
//  2. rotation: after a kubelet restart the re-sent NodePublishVolume, again
//     with the token in secrets only, carries a new token (other jti, later
//     iat), which the running container reads from the same mount.
//
// No line of any component's log (driver, kubelet, API server, etcd,
// containerd) contains either token or its signature. Skipped where the API
// server drops the field (its feature gate off: before 1.35).
func TestTokenInSecrets(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd {
		t.Skip("reads the token file and mountinfo inside a running container: EPHEMERA_E2E_RUNTIME=containerd")
	}
	requireDriver(t)
	ctx := context.Background()
	tr := c.startTokenfile(t, "tokenfile-secrets", true)
	d, pod, h := tr.d, tr.pod, tr.h
	inSecretsOnly := func(since int64, when string) {
		t.Helper()
		pub := d.rpcLines(since, "NodePublishVolume", h)
		if len(pub) == 0 {
			t.Errorf("%s: no NodePublishVolume request for %s in %s", when, h, d.logPath)
		}
		for _, l := range pub {
			if !strings.Contains(l, `\"secrets\":\"***stripped***\"`) || strings.Contains(l, "serviceAccount.tokens") {
				t.Errorf("%s: NodePublishVolume without secrets, or with the tokens in its volume_context: %s", when, l)
			}
		}
	}

	// 1. The first token, from secrets.
	inSecretsOnly(0, "first publish")
	tok1 := c.readToken(t, pod, tr.tokenPath)
	cl1 := c.checkToken(t, tok1, pod, tr.sa)
	t.Logf("first token: iat %d, exp %d, jti %s", cl1.Iat, cl1.Exp, cl1.Jti)

	// 2. Rotation by a kubelet restart (an empty token cache).
	tRot := time.Now()
	tok2 := c.rotateByKubeletRestart(ctx, t, tr, tok1, cl1, func(since int64) { inSecretsOnly(since, "after the kubelet restart") })

	ents, err := os.ReadDir(c.logDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(c.logDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for i, tok := range []string{tok1, tok2} {
			if bytes.Contains(b, []byte(tok)) || bytes.Contains(b, []byte(strings.SplitN(tok, ".", 3)[2])) {
				t.Errorf("token %d appears in %s", i+1, filepath.Join(c.logDir, e.Name()))
			}
		}
	}
	c.step("token in secrets (first publish, kubelet restart)", tRot)
}

// tokenfileRun is a running examples/tokenfile driver with its example pod
// Running (startTokenfile).
type tokenfileRun struct {
	d         *driver
	pod       *corev1.Pod
	sa        *corev1.ServiceAccount
	h         string // the volume handle
	tokenPath string // the token file in the container
	// sameMount fails the test if the node's or the container's mount of the
	// volume is another than at the first publish (a remount).
	sameMount func(when string)
}

// rotateByKubeletRestart restarts the kubelet, whose token cache is then
// empty, and returns the new token the NodePublishVolume it re-sends for the
// running pod brings into the volume: bound to the pod, with another jti and a
// later iat than the first token (tok1, cl1), published by no failed call, no
// NodeUnpublishVolume and on the same mount. between checks the driver's log
// from the restart on, once the new token is in the container.
func (c *cluster) rotateByKubeletRestart(ctx context.Context, t *testing.T, tr *tokenfileRun, tok1 string, cl1 tokenClaims, between func(since int64)) string {
	t.Helper()
	d, h := tr.d, tr.h
	tRot := time.Now()
	since := d.logSize()
	if err := c.restartKubelet(ctx); err != nil {
		t.Fatalf("restart kubelet: %v", err)
	}
	var tok2 string
	err := waitFor(ctx, 60*time.Second, 250*time.Millisecond, "a new token in the container after the kubelet restart", func() (bool, error) {
		tok2 = c.readToken(t, tr.pod, tr.tokenPath)
		return tok2 != tok1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("new token in the container %v after the kubelet restart began", time.Since(tRot).Round(time.Millisecond))
	between(since)
	cl2 := c.checkToken(t, tok2, tr.pod, tr.sa)
	t.Logf("new token: iat %d, exp %d, jti %s", cl2.Iat, cl2.Exp, cl2.Jti)
	if cl2.Jti == cl1.Jti || cl2.Iat <= cl1.Iat {
		t.Errorf("new token: jti %s iat %d, first token: jti %s iat %d; want another jti and a later iat", cl2.Jti, cl2.Iat, cl1.Jti, cl1.Iat)
	}
	if f := d.failedLines(since, h); len(f) > 0 {
		t.Errorf("a NodePublishVolume after the kubelet restart failed:\n%s", strings.Join(f, "\n"))
	}
	if n := len(d.rpcLines(since, "NodeUnpublishVolume", h)); n > 0 {
		t.Errorf("%d NodeUnpublishVolume calls after the kubelet restart, want none", n)
	}
	tr.sameMount("after the rotation")
	return tok2
}

// startTokenfile builds and starts examples/tokenfile (process and log name,
// dir below the run root) with its own CSIDriver (examples/tokenfile/csidriver.yaml
// with the test's audience and the minimum TTL; inSecrets: with
// spec.serviceAccountTokenInSecrets, skipping the test where the API server drops
// it) and starts examples/tokenfile/pod.yaml. Cleanups delete the pod (checking
// that nothing is left), stop the driver and delete the CSIDriver.
func (c *cluster) startTokenfile(t *testing.T, name string, inSecrets bool) *tokenfileRun {
	t.Helper()
	ctx := context.Background()
	tStart := time.Now()

	// The driver: examples/tokenfile built from its own module, run as a host
	// process as the scratch driver is (TestExampleFromChart covers the chart).
	bin := filepath.Join(c.root, "bin", "tokenfile")
	if err := c.goBuildIn(ctx, filepath.Join(c.repoRoot, tokenfileDir), bin, "."); err != nil {
		t.Fatal(err)
	}
	d, err := c.newDriver(&c.node, tokenfileDriver, bin, filepath.Join(c.root, name), name)
	if err != nil {
		t.Fatal(err)
	}

	// Its CSIDriver: the example's, with the test's audience and the minimum TTL.
	var cd storagev1.CSIDriver
	if err := decodeFile(filepath.Join(c.repoRoot, tokenfileDir, "csidriver.yaml"), &cd); err != nil {
		t.Fatal(err)
	}
	if cd.Name != tokenfileDriver || cd.Spec.RequiresRepublish == nil || !*cd.Spec.RequiresRepublish || len(cd.Spec.TokenRequests) == 0 {
		t.Fatalf("%s/csidriver.yaml: want CSIDriver %s with requiresRepublish and tokenRequests, got %s %+v", tokenfileDir, tokenfileDriver, cd.Name, cd.Spec)
	}
	cd.Spec.TokenRequests = tokenRequests(tokenAudience)
	if inSecrets {
		cd.Spec.ServiceAccountTokenInSecrets = ptrTo(true)
	}
	created, err := c.cs.StorageV1().CSIDrivers().Create(ctx, &cd, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last registered first: the pod (while the driver still
	// runs, so that it is unpublished), then the driver, then the CSIDriver.
	t.Cleanup(func() {
		if err := c.cs.StorageV1().CSIDrivers().Delete(ctx, tokenfileDriver, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete CSIDriver %s: %v", tokenfileDriver, err)
		}
	})
	if inSecrets && created.Spec.ServiceAccountTokenInSecrets == nil {
		// The API server drops the field while its feature gate is off.
		t.Skipf("the API server (Kubernetes %s) dropped the CSIDriver's spec.serviceAccountTokenInSecrets: feature gate CSIServiceAccountTokenSecrets is off (alpha before 1.35, beta and on by default in 1.35, GA in 1.36)", c.k8sVersion)
	}
	t.Cleanup(func() {
		d.stop()
		err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, "CSINode without "+tokenfileDriver, func() (bool, error) {
			ok, err := csiNodeLists(ctx, c, tokenfileDriver)
			return !ok, err
		})
		if err != nil {
			t.Error(err)
		}
	})
	if err := d.start(ctx); err != nil {
		t.Fatalf("start %s: %v", tokenfileDriver, err)
	}
	c.step(name+" built, started and registered", tStart)

	// The pod: examples/tokenfile/pod.yaml with the harness's image and the
	// test's audience, in a namespace of its own.
	if err := c.ensureNamespace(ctx, tokenNS); err != nil {
		t.Fatal(err)
	}
	var p corev1.Pod
	if err := decodeFile(filepath.Join(c.repoRoot, tokenfileDir, "pod.yaml"), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.Containers) != 1 || len(p.Spec.Containers[0].VolumeMounts) != 1 || len(p.Spec.Volumes) != 1 ||
		p.Spec.Volumes[0].CSI == nil || p.Spec.Volumes[0].CSI.Driver != tokenfileDriver || p.Spec.Volumes[0].CSI.VolumeAttributes["audience"] == "" {
		t.Fatalf("%s/pod.yaml: want one container and one inline volume of %s with an audience", tokenfileDir, tokenfileDriver)
	}
	mnt := p.Spec.Containers[0].VolumeMounts[0].MountPath
	tokenPath := mnt + "/token" // the default fileName
	grace, no := int64(1), false
	p.Namespace = tokenNS
	p.Spec.NodeName = nodeName
	p.Spec.HostNetwork = true
	p.Spec.DNSPolicy = corev1.DNSDefault
	p.Spec.EnableServiceLinks = &no
	p.Spec.AutomountServiceAccountToken = &no
	p.Spec.TerminationGracePeriodSeconds = &grace
	p.Spec.Volumes[0].CSI.VolumeAttributes["audience"] = tokenAudience
	ctn := &p.Spec.Containers[0]
	ctn.Image, ctn.ImagePullPolicy = c.testImage, corev1.PullNever
	ctn.Command, ctn.Args = []string{"/testbin"}, []string{"pause"}
	tPod := time.Now()
	pod := c.createPod(t, &p)
	t.Cleanup(func() {
		c.deletePod(t, pod, goneTimeout)
		c.cleanedUp(t, pod, pod.Spec.Volumes[0])
	})
	pod = c.waitRunning(t, pod, runningTimeout)
	vol := pod.Spec.Volumes[0]
	h := volumeHandle(string(pod.UID), vol.Name)
	c.step(name+"'s example pod Running", tPod)

	sa, err := c.cs.CoreV1().ServiceAccounts(tokenNS).Get(ctx, pod.Spec.ServiceAccountName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What stays the same throughout: the mount on the node and in the container.
	host := c.published(t, pod, vol)
	inCtr := c.containerMount(t, pod, mnt)
	t.Logf("mount: node ID %d at %s (%s), container ID %d at %s (%s, %s)", host.ID, host.MountPoint, host.FSType, inCtr.ID, mnt, inCtr.FSType, inCtr.Options)
	sameMount := func(when string) {
		t.Helper()
		if m := c.published(t, pod, vol); m.ID != host.ID {
			t.Errorf("%s: the node's mount at the target is now ID %d, was %d (remounted)", when, m.ID, host.ID)
		}
		if m := c.containerMount(t, pod, mnt); m.ID != inCtr.ID {
			t.Errorf("%s: the container's mount at %s is now ID %d, was %d (remounted)", when, mnt, m.ID, inCtr.ID)
		}
	}
	return &tokenfileRun{d: d, pod: pod, sa: sa, h: h, tokenPath: tokenPath, sameMount: sameMount}
}

// tokenRequests is the CSIDriver's tokenRequests for one audience, for tokenTTL.
func tokenRequests(audience string) []storagev1.TokenRequest {
	return []storagev1.TokenRequest{{Audience: audience, ExpirationSeconds: ptrTo(int64(tokenTTL))}}
}

// setTokenRequests updates tokenfile's CSIDriver (tokenRequests is mutable) to
// request a token for audience only.
func (c *cluster) setTokenRequests(t *testing.T, audience string) {
	t.Helper()
	ctx := context.Background()
	cur, err := c.cs.StorageV1().CSIDrivers().Get(ctx, tokenfileDriver, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.TokenRequests = tokenRequests(audience)
	if _, err := c.cs.StorageV1().CSIDrivers().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update CSIDriver %s tokenRequests to %q: %v", tokenfileDriver, audience, err)
	}
}

// waitLogLine waits for a line of d's log (from offset since) about the volume
// handle h that matches re.
func (c *cluster) waitLogLine(t *testing.T, d *driver, since int64, h string, re *regexp.Regexp, timeout time.Duration) {
	t.Helper()
	err := waitFor(context.Background(), timeout, 200*time.Millisecond, fmt.Sprintf("%s for %s in %s", re, h, d.logPath), func() (bool, error) {
		for _, l := range strings.Split(d.logSince(since), "\n") {
			if strings.Contains(l, h) && re.MatchString(l) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// refreshes is ephemera_refresh_total{result}.
func refreshes(s scrape, result string) float64 {
	return s.sum("ephemera_refresh_total", map[string]string{"result": result})
}

// catInContainer returns the whole content of path as the pod's container
// reads it (testbin cat, through ctr tasks exec).
func (c *cluster) catInContainer(t *testing.T, p *corev1.Pod, path string) string {
	t.Helper()
	l := wantStep(t, c.exec(t, p, "cat", path), 0, "cat ok")
	i := strings.Index(l, "content=")
	if i < 0 {
		t.Fatalf("cat %s: %q", path, l)
	}
	s, err := strconv.Unquote(l[i+len("content="):])
	if err != nil {
		t.Fatalf("cat %s: %v", path, err)
	}
	return s
}

// readToken is the token file as the container reads it.
func (c *cluster) readToken(t *testing.T, p *corev1.Pod, path string) string {
	t.Helper()
	tok := c.catInContainer(t, p, path)
	if strings.Count(tok, ".") != 2 {
		t.Fatalf("%s in the container: not a JWT (%d bytes)", path, len(tok))
	}
	return tok
}

// containerMount is the one mount at dir in the container's own
// /proc/self/mountinfo (its mount IDs are its namespace's).
func (c *cluster) containerMount(t *testing.T, p *corev1.Pod, dir string) mount.MountInfo {
	t.Helper()
	infos, err := mount.ParseMountInfo(strings.NewReader(c.catInContainer(t, p, "/proc/self/mountinfo")))
	if err != nil {
		t.Fatal(err)
	}
	var at []mount.MountInfo
	for _, m := range infos {
		if m.MountPoint == dir {
			at = append(at, m)
		}
	}
	if len(at) != 1 || at[0].FSType != "tmpfs" {
		t.Fatalf("the container's mounts at %s: %+v, want one tmpfs", dir, at)
	}
	return at[0]
}

// tokenClaims are the claims of a bound service-account token.
type tokenClaims struct {
	Aud audiences `json:"aud"`
	Sub string    `json:"sub"`
	Iat int64     `json:"iat"`
	Exp int64     `json:"exp"`
	Jti string    `json:"jti"`
	K8s struct {
		Namespace string   `json:"namespace"`
		Pod       *nameUID `json:"pod"`
		SA        nameUID  `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

type nameUID struct{ Name, UID string }

// audiences is a JWT "aud": a string or an array of strings.
type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audiences{one}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(a))
}

// checkToken decodes tok's claims and checks them against the pod: the
// requested audience only, the pod's service account, bound to the pod,
// tokenTTL seconds; then asks the API server (TokenReview) whether it
// authenticates that service account for the audience, and not for the API
// server's own audience.
func (c *cluster) checkToken(t *testing.T, tok string, p *corev1.Pod, sa *corev1.ServiceAccount) tokenClaims {
	t.Helper()
	var cl tokenClaims
	parts := strings.Split(tok, ".")
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err == nil {
		err = json.Unmarshal(b, &cl)
	}
	if err != nil {
		t.Fatalf("token claims: %v", err)
	}
	sub := "system:serviceaccount:" + p.Namespace + ":" + sa.Name
	if !slices.Equal(cl.Aud, []string{tokenAudience}) {
		t.Errorf("token aud %q, want [%q]", cl.Aud, tokenAudience)
	}
	if cl.Sub != sub {
		t.Errorf("token sub %q, want %q", cl.Sub, sub)
	}
	k := cl.K8s
	if k.Namespace != p.Namespace || k.SA != (nameUID{sa.Name, string(sa.UID)}) ||
		k.Pod == nil || *k.Pod != (nameUID{p.Name, string(p.UID)}) {
		t.Errorf("token kubernetes.io claims %+v (pod %+v), want namespace %s, serviceaccount %s/%s, pod %s/%s",
			k, k.Pod, p.Namespace, sa.Name, sa.UID, p.Name, p.UID)
	}
	if cl.Exp-cl.Iat != tokenTTL || cl.Jti == "" {
		t.Errorf("token iat %d, exp %d (%d s), jti %q: want %d s and a jti", cl.Iat, cl.Exp, cl.Exp-cl.Iat, cl.Jti, tokenTTL)
	}

	ctx := context.Background()
	review := func(aud []string) *authnv1.TokenReviewStatus {
		r, err := c.cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
			Spec: authnv1.TokenReviewSpec{Token: tok, Audiences: aud},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("TokenReview: %v", err)
		}
		return &r.Status
	}
	st := review([]string{tokenAudience})
	if !st.Authenticated || st.User.Username != sub || !slices.Equal(st.Audiences, []string{tokenAudience}) ||
		!slices.Equal(st.User.Extra["authentication.kubernetes.io/pod-uid"], authnv1.ExtraValue{string(p.UID)}) {
		t.Errorf("TokenReview for %q: authenticated %v, user %q, audiences %q, extra %v, error %q; want %s, bound to pod %s",
			tokenAudience, st.Authenticated, st.User.Username, st.Audiences, st.User.Extra, st.Error, sub, p.UID)
	}
	if st := review(nil); st.Authenticated {
		t.Errorf("TokenReview for the API server's audience: authenticated as %q, want refused (the token is for %q only)", st.User.Username, tokenAudience)
	}
	return cl
}
