//go:build linux

package hostile_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/test/internal/hostile"
)

func TestMain(m *testing.M) {
	if opts, ok := hostile.FromEnv(); ok {
		os.Exit(hostile.Main(opts))
	}
	os.Exit(m.Run())
}

// rig starts the plugin of mode as a process in a short temporary
// directory, and a client of its socket.
func rig(t *testing.T, opts hostile.Options, so hostile.StartOptions) (*hostile.Process, pb.PluginClient) {
	t.Helper()
	dir, err := os.MkdirTemp("", "hostile")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	opts.Endpoint = "unix://" + filepath.Join(dir, "p.sock")
	so.Log = filepath.Join(dir, "plugin.log")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(so.Log)
			t.Logf("plugin log:\n%s", b)
		}
	})
	p := hostile.Start(t, opts, so)
	conn, err := grpc.NewClient(opts.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return p, pb.NewPluginClient(conn)
}

const podUID = "0b7f0c4e-6f1a-4e8b-9d6c-1f2e3d4c5b6a"

var vol = &pb.Volume{Id: api.VolumeHandle(podUID, "data"), Name: "data", Pod: &pb.Pod{Namespace: "ns", Name: "pod", Uid: podUID}}

// callContent calls Content with a deadline of d and returns the answer, its
// code and how long it took.
func callContent(t *testing.T, c pb.PluginClient, d time.Duration) (*pb.ContentResponse, codes.Code, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	start := time.Now()
	resp, err := c.Content(ctx, &pb.ContentRequest{Volume: vol})
	return resp, status.Code(err), time.Since(start)
}

func answerBytes(r *pb.ContentResponse) (n int) {
	for _, f := range r.GetFiles() {
		n += len(f.GetData())
	}
	return n
}

// TestContentModes: each content-only mode answers, or does not, as the
// package documents.
func TestContentModes(t *testing.T) {
	t.Run("healthy", func(t *testing.T) {
		_, c := rig(t, hostile.Options{Mode: hostile.Healthy}, hostile.StartOptions{})
		resp, code, took := callContent(t, c, 5*time.Second)
		if code != codes.OK || len(resp.GetFiles()) != len(hostile.HealthyFiles) || took > time.Second {
			t.Errorf("healthy: %v, %d files after %v; want OK, %d files, at once", code, len(resp.GetFiles()), took, len(hostile.HealthyFiles))
		}
	})
	t.Run("rotate", func(t *testing.T) {
		const blob = 100 << 10
		_, c := rig(t, hostile.Options{Mode: hostile.Rotate, RotateBytes: blob}, hostile.StartOptions{})
		prev := map[string]string{}
		for serial := int64(1); serial <= 2; serial++ {
			resp, code, _ := callContent(t, c, 5*time.Second)
			files := map[string]string{}
			for _, f := range resp.GetFiles() {
				files[f.GetPath()] = string(f.GetData())
			}
			if code != codes.OK || len(files) != len(hostile.RotateFiles) || len(files["blob"]) != blob {
				t.Fatalf("rotate: %v, %d files, a blob of %d bytes; want OK, %d files, %d bytes", code, len(files), len(files["blob"]), len(hostile.RotateFiles), blob)
			}
			if want := hostile.RotateToken("ns/pod", vol.GetId(), serial); files["token"] != want {
				t.Errorf("rotate: answer %d's token %q, want %q", serial, files["token"], want)
			}
			for _, name := range hostile.RotateFiles {
				if files[name] == prev[name] {
					t.Errorf("rotate: answer %d's %s is the answer before's", serial, name)
				}
			}
			prev = files
		}
	})
	t.Run("hang", func(t *testing.T) {
		_, c := rig(t, hostile.Options{Mode: hostile.Hang}, hostile.StartOptions{})
		_, code, took := callContent(t, c, 300*time.Millisecond)
		if code != codes.DeadlineExceeded || took < 300*time.Millisecond {
			t.Errorf("hang: %v after %v; want DeadlineExceeded at the deadline", code, took)
		}
	})
	t.Run("late", func(t *testing.T) {
		_, c := rig(t, hostile.Options{Mode: hostile.Late}, hostile.StartOptions{})
		_, code, took := callContent(t, c, 300*time.Millisecond)
		if code != codes.DeadlineExceeded || took < 300*time.Millisecond {
			t.Errorf("late: %v after %v; want DeadlineExceeded at the deadline", code, took)
		}
	})
	t.Run("trickle", func(t *testing.T) {
		const rate = 1 << 20 // 256 KiB in a quarter of a second
		_, c := rig(t, hostile.Options{Mode: hostile.Trickle, TrickleRate: rate}, hostile.StartOptions{})
		resp, code, took := callContent(t, c, 10*time.Second)
		if min := time.Duration(hostile.TrickleAnswerBytes) * time.Second / rate; code != codes.OK || answerBytes(resp) != hostile.TrickleAnswerBytes || took < min {
			t.Errorf("trickle: %v, %d bytes after %v; want OK, %d bytes, after at least %v", code, answerBytes(resp), took, hostile.TrickleAnswerBytes, min)
		}
		_, code, took = callContent(t, c, 100*time.Millisecond)
		if code != codes.DeadlineExceeded {
			t.Errorf("trickle within 100ms: %v after %v; want DeadlineExceeded", code, took)
		}
	})
	t.Run("flood", func(t *testing.T) {
		const bound = 4 << 20
		_, c := rig(t, hostile.Options{Mode: hostile.Flood, MaxContentBytes: bound}, hostile.StartOptions{})
		for range 2 {
			resp, code, _ := callContent(t, c, 10*time.Second)
			var cost int64
			for _, f := range resp.GetFiles() {
				cost += content.Cost(f.GetPath(), len(f.GetData()))
			}
			if code != codes.OK || cost != bound {
				t.Errorf("flood: %v, an answer of Cost %d; want OK, Cost %d (the bound)", code, cost, bound)
			}
		}
	})
	t.Run("crash", func(t *testing.T) {
		p, c := rig(t, hostile.Options{Mode: hostile.Crash}, hostile.StartOptions{RestartDelay: 100 * time.Millisecond})
		resp, code, took := callContent(t, c, 5*time.Second)
		if code != codes.Unavailable || took > time.Second {
			t.Errorf("crash: %v with %d bytes after %v; want the connection lost mid-answer (Unavailable), at once", code, answerBytes(resp), took)
		}
		deadline := time.Now().Add(10 * time.Second)
		for p.Starts() < 2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		for time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			_, err := c.Handshake(ctx, &pb.HandshakeRequest{ProtocolVersions: []string{plugin.ProtocolVersion}})
			cancel()
			if err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if p.Starts() < 2 {
			t.Fatalf("crash: %d starts, want the process restarted", p.Starts())
		}
		if _, code, _ := callContent(t, c, 5*time.Second); code == codes.OK {
			t.Errorf("crash, restarted: Content answered OK; want it to crash again")
		}
	})
	t.Run("flap", func(t *testing.T) {
		const period = 200 * time.Millisecond
		p, _ := rig(t, hostile.Options{Mode: hostile.Flap, FlapPeriod: period}, hostile.StartOptions{})
		sock := p.Endpoint[len("unix://"):]
		var up, down bool
		for end := time.Now().Add(10 * period); time.Now().Before(end) && !(up && down); time.Sleep(10 * time.Millisecond) {
			_, err := os.Stat(sock)
			up, down = up || err == nil, down || err != nil
		}
		if !up || !down {
			t.Errorf("flap: socket seen up %v, down %v within %v; want both", up, down, 10*period)
		}
	})
}

// TestHangDelete: a hang-delete plugin creates directories below the shared
// one, and never answers Delete; a dir plugin deletes them.
func TestHangDelete(t *testing.T) {
	for _, mode := range []hostile.Mode{hostile.HangDelete, hostile.Dir} {
		t.Run(string(mode), func(t *testing.T) {
			shared, err := os.MkdirTemp("", "hostile-shared")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(shared) })
			_, c := rig(t, hostile.Options{Mode: mode, Dir: shared}, hostile.StartOptions{})
			v := vol
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			resp, err := c.Create(ctx, &pb.CreateRequest{Volume: v})
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			created := filepath.Join(shared, resp.GetSource().GetDirectory().GetPath())
			if st, err := os.Stat(created); err != nil || !st.IsDir() {
				t.Fatalf("Create answered %v: %v", resp.GetSource(), err)
			}
			ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			_, err = c.Delete(ctx, &pb.DeleteRequest{Volume: v})
			switch {
			case mode == hostile.HangDelete && status.Code(err) != codes.DeadlineExceeded:
				t.Errorf("Delete: %v, want DeadlineExceeded", err)
			case mode == hostile.Dir && err != nil:
				t.Errorf("Delete: %v", err)
			}
			if _, err := os.Stat(created); (err == nil) != (mode == hostile.HangDelete) {
				t.Errorf("after Delete, %s: %v", created, err)
			}
		})
	}
}
