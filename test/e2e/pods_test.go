//go:build e2e && linux

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
)

const dataPath = "/data"

// steps joins testbin steps with "--" (see images/testbin).
func steps(s ...[]string) []string {
	var out []string
	for i, x := range s {
		if i > 0 {
			out = append(out, "--")
		}
		out = append(out, x...)
	}
	return out
}

func st(args ...string) []string { return args }

// csiVolume is an inline volume of the driver under test.
func csiVolume(name string, attrs map[string]string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver: driverName, VolumeAttributes: attrs,
	}}}
}

func memoryEmptyDir(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
		Medium: corev1.StorageMediumMemory,
	}}}
}

// newPod returns a hostNetwork pod bound to the node by spec.nodeName (the
// scheduler leaves it alone) with one container running testbin with args, and
// vol mounted at /data.
func (c *cluster) newPod(ns, name string, vol corev1.Volume, args []string) *corev1.Pod {
	grace := int64(1)
	no := false
	if len(args) == 0 {
		args = []string{"pause"}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"e2e": "ephemera"}},
		Spec: corev1.PodSpec{
			NodeName:                      nodeName,
			HostNetwork:                   true,
			DNSPolicy:                     corev1.DNSDefault,
			EnableServiceLinks:            &no,
			AutomountServiceAccountToken:  &no,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "c",
				Image:           c.testImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/testbin"},
				Args:            args,
				VolumeMounts:    []corev1.VolumeMount{{Name: vol.Name, MountPath: dataPath}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("1m"),
				}},
			}},
			Volumes: []corev1.Volume{vol},
		},
	}
}

func (c *cluster) createPod(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	out, err := c.cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return out
}

// waitPod reads the pod every interval until cond holds for it (cond's
// error as waitFor takes it: the reason it does not hold yet, or stop(err)
// to give up), and returns the pod as last read; after d it fails the test
// with the pod's events. what names the wait in that failure.
func (c *cluster) waitPod(t *testing.T, p *corev1.Pod, d, interval time.Duration, what string, cond func(cur *corev1.Pod) (bool, error)) *corev1.Pod {
	t.Helper()
	var cur *corev1.Pod
	err := waitFor(context.Background(), d, interval, what, func() (bool, error) {
		var err error
		cur, err = c.cs.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return cond(cur)
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, c.podEvents(p))
	}
	return cur
}

// waitRunning waits until the pod is Running and returns it.
func (c *cluster) waitRunning(t *testing.T, p *corev1.Pod, d time.Duration) *corev1.Pod {
	t.Helper()
	return c.waitPod(t, p, d, 100*time.Millisecond, "pod "+p.Namespace+"/"+p.Name+" Running", func(cur *corev1.Pod) (bool, error) {
		switch cur.Status.Phase {
		case corev1.PodRunning:
			return true, nil
		case corev1.PodFailed, corev1.PodSucceeded:
			return false, stop(fmt.Errorf("pod is %s: %s", cur.Status.Phase, cur.Status.Message))
		}
		return false, fmt.Errorf("phase %s", cur.Status.Phase)
	})
}

// deletePod deletes the pod and, if wait > 0, waits until the object is gone (the
// kubelet removes it only after the volumes are torn down).
func (c *cluster) deletePod(t *testing.T, p *corev1.Pod, wait time.Duration) {
	t.Helper()
	err := c.cs.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod: %v", err)
	}
	if wait > 0 {
		c.waitPodGone(t, p, wait)
	}
}

func (c *cluster) waitPodGone(t *testing.T, p *corev1.Pod, d time.Duration) {
	t.Helper()
	err := waitFor(context.Background(), d, 200*time.Millisecond, "pod "+p.Namespace+"/"+p.Name+" gone", func() (bool, error) {
		_, err := c.cs.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, c.podEvents(p))
	}
}

// podEvents returns the pod's events, one per line.
func (c *cluster) podEvents(p *corev1.Pod) string {
	evs, err := c.cs.CoreV1().Events(p.Namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": p.Name}.String(),
	})
	if err != nil {
		return "(events: " + err.Error() + ")"
	}
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "  %s %s (x%d): %s\n", e.Type, e.Reason, e.Count, e.Message)
	}
	return b.String()
}

// waitEvent waits for an event of the pod whose message matches re.
func (c *cluster) waitEvent(t *testing.T, p *corev1.Pod, re *regexp.Regexp, d time.Duration) string {
	t.Helper()
	var msg string
	err := waitFor(context.Background(), d, 250*time.Millisecond, "pod event matching "+re.String(), func() (bool, error) {
		evs, err := c.cs.CoreV1().Events(p.Namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": p.Name}.String(),
		})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if re.MatchString(e.Message) {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, c.podEvents(p))
	}
	return msg
}

// hostVolumePath is where the kubelet mounts the pod's volume on the node.
func (c *cluster) hostVolumePath(p *corev1.Pod, vol corev1.Volume) string {
	plugin := "kubernetes.io~csi"
	suffix := "mount"
	if vol.EmptyDir != nil {
		plugin, suffix = "kubernetes.io~empty-dir", ""
	}
	return filepath.Join(c.kubeletRoot, "pods", string(p.UID), "volumes", plugin, vol.Name, suffix)
}

// translate maps container paths below /data to the volume's host path (fake CRI).
func (c *cluster) translate(p *corev1.Pod, args []string) []string {
	host := c.hostVolumePath(p, p.Spec.Volumes[0])
	out := make([]string, len(args))
	for i, a := range args {
		if a == dataPath || strings.HasPrefix(a, dataPath+"/") {
			a = host + strings.TrimPrefix(a, dataPath)
		}
		out[i] = a
	}
	return out
}

// exec runs testbin with args inside the pod's container and returns its STEP
// lines. With containerd it is `ctr tasks exec` in the container; with the fake CRI
// (no containers exist) the same binary runs on the node against the volume's host
// path, which is what the container would have bind-mounted.
func (c *cluster) exec(t *testing.T, p *corev1.Pod, args ...string) []string {
	t.Helper()
	var out []byte
	var err error
	if c.runtime == runtimeFake {
		out, err = exec.Command(c.testbinHost, c.translate(p, args)...).CombinedOutput()
	} else {
		cur, gerr := c.cs.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
		if gerr != nil {
			t.Fatalf("get pod: %v", gerr)
		}
		if len(cur.Status.ContainerStatuses) == 0 || cur.Status.ContainerStatuses[0].ContainerID == "" {
			t.Fatalf("pod %s has no container ID yet", p.Name)
		}
		id := cur.Status.ContainerStatuses[0].ContainerID
		id = id[strings.Index(id, "://")+3:]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var s string
		s, err = c.ctr(ctx, append([]string{"tasks", "exec", "--exec-id", fmt.Sprintf("e2e-%d", time.Now().UnixNano()), id, "/testbin"}, args...)...)
		out = []byte(s)
	}
	if err != nil {
		t.Fatalf("exec %v in %s: %v\n%s", args, p.Name, err, out)
	}
	return stepLines(string(out))
}

func stepLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if i := strings.Index(l, "STEP "); i >= 0 {
			out = append(out, l[i:])
		}
	}
	return out
}

// output returns the STEP lines the pod's container printed (from the kubelet's
// podLogsDir; kubectl logs cannot reach this kubelet). It waits until at least n
// lines exist. With the fake CRI, no container runs: the container's steps are run
// once on the node against the volume's host path instead.
func (c *cluster) output(t *testing.T, p *corev1.Pod, n int) []string {
	t.Helper()
	if c.runtime == runtimeFake {
		fakeOutMu.Lock()
		defer fakeOutMu.Unlock()
		if out, ok := fakeOut[p.UID]; ok {
			return out
		}
		args := append([]string(nil), p.Spec.Containers[0].Args...)
		// Drop the final sleep/pause step: it would block.
		if i := lastStep(args); i >= 0 && (args[i] == "pause" || args[i] == "sleep") {
			args = args[:max(i-1, 0)]
		}
		var lines []string
		if len(args) > 0 {
			lines = c.exec(t, p, args...)
		}
		fakeOut[p.UID] = lines
		return lines
	}
	var lines []string
	err := waitFor(context.Background(), 30*time.Second, 100*time.Millisecond, fmt.Sprintf("%d output lines of %s", n, p.Name), func() (bool, error) {
		lines = c.containerLog(p)
		return len(lines) >= n, nil
	})
	if err != nil {
		t.Fatalf("%v; got %q", err, lines)
	}
	return lines
}

func lastStep(args []string) int {
	for i := len(args) - 1; i >= 0; i-- {
		if i == 0 || args[i-1] == "--" {
			return i
		}
	}
	return -1
}

// containerLog returns the STEP lines of the first run of the pod's first
// container (0.log) on node n (c.containerLog: the first node's).
func (n *node) containerLog(p *corev1.Pod) []string {
	path := filepath.Join(n.podLogsDir, fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), p.Spec.Containers[0].Name, "0.log")
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// CRI log format: "<RFC3339Nano> <stream> <P|F> <message>".
		fs := strings.SplitN(sc.Text(), " ", 4)
		if len(fs) == 4 && strings.HasPrefix(fs[3], "STEP ") {
			out = append(out, fs[3])
		}
	}
	return out
}

// wantStep finds the line of step i and checks it contains every substring.
func wantStep(t *testing.T, lines []string, i int, subs ...string) string {
	t.Helper()
	prefix := fmt.Sprintf("STEP %d ", i)
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			for _, s := range subs {
				if !strings.Contains(l, s) {
					t.Errorf("step %d: want %q in %q", i, s, l)
				}
			}
			return l
		}
	}
	t.Errorf("step %d missing in output %q", i, lines)
	return ""
}

var (
	fakeOutMu sync.Mutex
	fakeOut   = map[types.UID][]string{}
)
