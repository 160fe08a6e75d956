package plugin_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
	"github.com/ephemera-csi/ephemera/framework"
	contentpkg "github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/plugin"
)

// emptyFiles returns n empty files named f0, f1, ...
func emptyFiles(n int) []*pb.File {
	files := make([]*pb.File, n)
	for i := range files {
		files[i] = &pb.File{Path: fmt.Sprintf("f%d", i)}
	}
	return files
}

// A content-only plugin's answer beyond the bounds (a path thousands of
// levels deep, too long, too many files, many empty files whose overhead
// exceeds the byte bound) is refused before it is decoded or written: the
// publish fails at once with a message naming the bound, a retry gets the
// same answer (not Aborted: nothing is still working on the volume), nothing
// is left mounted. On 9bf726c the deep path kept a core busy for minutes
// (depth 1,000: 8.4 s) and the others were written.
func TestContentBeyondBoundsRefused(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name  string
		opts  plugin.Options
		files []*pb.File
		want  string
	}{
		{"Deep", plugin.Options{}, []*pb.File{{Path: strings.Repeat("a/", 3000) + "f", Data: []byte("x")}}, "6001 bytes long, beyond the bound of 1024"},
		{"Depth", plugin.Options{}, []*pb.File{{Path: strings.Repeat("a/", 32) + "f", Data: []byte("x")}}, "33 levels deep, beyond the bound of 32"},
		{"Long", plugin.Options{}, []*pb.File{{Path: strings.Repeat("n", 200) + "/" + strings.Repeat("m", 900), Data: []byte("x")}}, "bytes long, beyond the bound of 1024"},
		{"LongComponent", plugin.Options{}, []*pb.File{{Path: strings.Repeat("n", 256)}}, "has a component of 256 bytes"},
		{"ManyFiles", plugin.Options{}, emptyFiles(contentpkg.DefaultMaxFiles + 1), "more than 10000 files"},
		{"FewerFilesThanTheirOverhead", plugin.Options{MaxContentBytes: 1 << 20, MaxContentFiles: 1 << 20}, emptyFiles(3000), "takes more than 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Name, tc.opts.Endpoint = "p", serveRogue(t, &rogue{caps: content, files: tc.files})
			h := startDriver(t, newClient(t, tc.opts), framework.Options{})
			k := h.Kubelet
			pod := k.NewPod("ns", "bounds")
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			for try := range 2 {
				// 64Mi: inodes enough for the deep tree (on 9bf726c a 4Mi tmpfs
				// ran out of them before the CPU was burnt).
				err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "64Mi"}})
				if status.Code(err) == codes.Aborted || status.Code(err) == codes.DeadlineExceeded || err == nil ||
					!strings.Contains(err.Error(), "plugin p: its Content answer is beyond the driver's bounds") || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("publish %d: %v, want a refusal naming the plugin and %q", try+1, err, tc.want)
				}
			}
			if mounted, _ := isMountPoint(k.TargetPath(pod, "v")); mounted {
				t.Fatal("the target is mounted after a refused publish")
			}
			if err := k.DeletePod(t.Context(), pod); err != nil {
				t.Fatal(err)
			}
			h.RequireClean(t)
		})
	}
}

// gate is a content-only plugin whose Content answers only when released,
// counting the calls in flight.
type gate struct {
	pb.UnimplementedPluginServer
	mu       sync.Mutex
	inFlight int
	most     int
	arrived  chan struct{} // one value per call that arrives
	release  chan struct{} // closed: answer
}

func (g *gate) Handshake(context.Context, *pb.HandshakeRequest) (*pb.HandshakeResponse, error) {
	return &pb.HandshakeResponse{Name: "gate", Version: "1", ProtocolVersion: plugin.ProtocolVersion, Capabilities: content}, nil
}

func (g *gate) Content(ctx context.Context, _ *pb.ContentRequest) (*pb.ContentResponse, error) {
	g.mu.Lock()
	g.inFlight++
	g.most = max(g.most, g.inFlight)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inFlight--
		g.mu.Unlock()
	}()
	g.arrived <- struct{}{}
	select {
	case <-g.release:
		return &pb.ContentResponse{Files: []*pb.File{{Path: "f", Data: []byte("gate")}}}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// The bytes of Content answers in flight are bounded driver-wide: with a
// budget of two answers (Options.Volumes.ContentBytesInFlight), two pods' Content
// calls wait on a slow plugin and a third pod's never reaches it; its publish
// gets ResourceExhausted naming the budget once its deadline passes. Once the
// two answers are written, the third pod's retry publishes. On 9bf726c the
// third call reached the plugin: four pods' 63 MiB answers took the driver to
// 805 MiB.
func TestContentBytesInFlightBounded(t *testing.T) {
	requireRoot(t)
	g := &gate{arrived: make(chan struct{}, 8), release: make(chan struct{})}
	ep := grpcServer(t, func(s *grpc.Server) { pb.RegisterPluginServer(s, g) })
	b := newClient(t, plugin.Options{Name: "p", Endpoint: ep, MaxContentBytes: 1 << 20})
	h := startDriver(t, b, framework.Options{Volumes: framework.VolumeOptions{ContentBytesInFlight: 2 << 20}})
	k := h.Kubelet
	pods := []*drivertest.Pod{k.NewPod("ns", "a"), k.NewPod("ns", "b"), k.NewPod("ns", "c")}
	errs := make(chan error, 2)
	for _, pod := range pods[:2] {
		go func() { errs <- k.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v", Attributes: size}) }()
	}
	for range 2 {
		select {
		case <-g.arrived:
		case <-time.After(20 * time.Second):
			t.Fatal("the first two Content calls did not reach the plugin")
		}
	}
	// The driver answers ResourceExhausted when the request's deadline
	// passes (TestBudget), after this client gave up.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	err := k.Publish(ctx, pods[2], drivertest.InlineVolume{Name: "v", Attributes: size})
	cancel()
	if c := status.Code(err); c != codes.DeadlineExceeded && c != codes.ResourceExhausted {
		t.Errorf("third publish with the budget taken: %v, want it to wait until its deadline", err)
	}
	g.mu.Lock()
	most := g.most
	g.mu.Unlock()
	if most != 2 {
		t.Errorf("%d Content calls in flight at most, want 2 (the budget's)", most)
	}
	close(g.release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("publish waiting on the plugin: %v", err)
		}
	}
	// As the kubelet does, retry while the driver still finishes the call
	// this client gave up on (Aborted: already in progress).
	err = k.Publish(t.Context(), pods[2], drivertest.InlineVolume{Name: "v", Attributes: size})
	for try := 0; status.Code(err) == codes.Aborted && try < 50; try++ {
		time.Sleep(100 * time.Millisecond)
		err = k.Publish(t.Context(), pods[2], drivertest.InlineVolume{Name: "v", Attributes: size})
	}
	if err != nil {
		t.Fatalf("third publish once the budget is free: %v", err)
	}
	<-g.arrived
	if got := readFile(t, k.TargetPath(pods[2], "v")+"/f"); got != "gate" {
		t.Errorf("content %q, want gate", got)
	}
	for _, pod := range pods {
		if err := k.DeletePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
	}
	h.RequireClean(t)
}

// A plugin's bound beyond the driver's budget is refused when the driver is
// made, naming both: it could never be reserved.
func TestContentBoundBeyondBudgetRefused(t *testing.T) {
	b := newClient(t, plugin.Options{Name: "p", Endpoint: "unix://" + sockDir(t) + "/none.sock", MaxContentBytes: 64 << 20})
	_, err := framework.New(framework.Options{
		DriverName: "t.csi.ephemera.dev",
		Backends:   map[string]framework.Backend{"p": b},
		Node: framework.NodeOptions{
			ID:             "n",
			StateDir:       t.TempDir(),
			KubeletRootDir: t.TempDir(),
		},
	})
	if err == nil || !strings.Contains(err.Error(), "backend p bounds its content answers at 67108864 bytes, beyond Volumes.ContentBytesInFlight 50331648") {
		t.Fatalf("New: %v, want the bound refused", err)
	}
}

// A plugin's own bounds are those its files are written under: with
// MaxContentFiles above the content package's default, an answer of more
// files than that default is checked, decoded and written.
func TestContentWrittenUnderThePluginsBounds(t *testing.T) {
	requireRoot(t)
	n := contentpkg.DefaultMaxFiles + 1
	ep := serveRogue(t, &rogue{caps: content, files: emptyFiles(n)})
	// No content capacity: a 128Mi volume's reservation where the driver
	// pays (no pod cgroups) is beyond the default, and not this test's subject.
	h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: ep, MaxContentFiles: n}), framework.Options{Volumes: framework.VolumeOptions{ContentCapacity: framework.NoContentCapacity}})
	k := h.Kubelet
	pod := k.NewPod("ns", "many")
	// 128Mi: 32,768 inodes, for each file and its visible link.
	if err := k.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "128Mi"}}); err != nil {
		t.Fatalf("publish of %d files with MaxContentFiles %d: %v", n, n, err)
	}
	got, err := contentpkg.Read(k.TargetPath(pod, "v"))
	if err != nil || len(got) != n {
		t.Fatalf("the volume holds %d files (%v), want %d", len(got), err, n)
	}
	if err := k.DeletePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
}
