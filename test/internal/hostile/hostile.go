// Package hostile is a plugin of the Ephemera plugin protocol
// (api/plugin/v1alpha1) that misbehaves on purpose, for the tests that prove
// one plugin cannot take the rest of a node's volume operations down (issue
// 32, "Bulkheads"; test/security). It is a real plugin process: the test
// binary re-executed (see [Main]), served through framework/pluginserver as a
// plugin written in Go is, and started and restarted by [Start].
//
// # Modes
//
// Content-only plugins (the driver mounts a tmpfs for each volume and asks
// the plugin for its files):
//
//   - [Healthy]: answers three small files at once (the control plugin);
//   - [Hang]: Content blocks until its context ends (the driver's deadline, or
//     the driver going away) and never answers;
//   - [Trickle]: answers 256 KiB at once, whose bytes reach the driver slowly
//     (Options.TrickleRate, 256 KiB/s for the whole connection): every byte
//     the plugin sends goes through a proxy in the plugin's process that
//     throttles it, so an answer in flight holds whatever the driver gave it
//     until the last byte, and answers on one connection queue behind each
//     other;
//   - [Flood]: answers as much as the driver's bound allows, every time: one
//     file whose content.Cost is Options.MaxContentBytes (16 MiB, the
//     driver's default max-content-bytes);
//   - [Crash]: answers 1 MiB and the process dies (exit status 3) once 32 KiB
//     of it reached the driver: mid-answer. [Start] restarts it
//     (StartOptions.RestartDelay), so that it flaps as a crash-looping
//     container does;
//   - [Late]: answers just after the driver's deadline (the context's, which
//     gRPC carries), ignoring the cancellation: the answer is lost;
//   - [Flap]: healthy, but its socket is up for Options.FlapPeriod and gone for
//     as long, over and over.
//
// And one that is healthy but whose answer is new every time, as a token or
// certificate provider's is, so that every refresh swaps the volume's files:
//
//   - [Rotate]: a token naming the call ("<namespace>/<pod> <volume ID>
//     <serial>", the serial counting the process's answers from 1), a
//     1.5 KiB certificate bundle and a file "blob" of Options.RotateBytes,
//     all three different in every answer.
//
// Plugins that create storage (directories below Options.Dir, the directory
// shared with the driver through --plugin NAME=...,dir=DIR):
//
//   - [Dir]: drivers/dir served as a plugin, healthy;
//   - [HangDelete]: the same, but Delete blocks until its context ends.
package hostile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// Mode is how a plugin behaves.
type Mode string

// The modes (see the package documentation).
const (
	Healthy    Mode = "healthy"
	Hang       Mode = "hang"
	Trickle    Mode = "trickle"
	Flood      Mode = "flood"
	Crash      Mode = "crash"
	Late       Mode = "late"
	Flap       Mode = "flap"
	Rotate     Mode = "rotate"
	Dir        Mode = "dir"
	HangDelete Mode = "hang-delete"
)

// ContentModes are the misbehaviours of a content-only plugin.
var ContentModes = []Mode{Hang, Trickle, Flood, Crash, Late, Flap}

// Sizes of the answers.
const (
	// TrickleAnswerBytes is the data of a Trickle answer.
	TrickleAnswerBytes = 256 << 10
	// CrashAnswerBytes is the data of a Crash answer, and CrashAfterBytes
	// how much of it reaches the driver before the process dies.
	CrashAnswerBytes = 1 << 20
	CrashAfterBytes  = 32 << 10
	// lateBy is how long after the deadline a Late answer comes.
	lateBy = 50 * time.Millisecond
)

// Options configure a hostile plugin.
type Options struct {
	// Mode is how it behaves. Required.
	Mode Mode
	// Endpoint is its socket, unix:///absolute/path.sock. Required.
	Endpoint string
	// Dir is the directory it shares with the driver (Dir, HangDelete).
	Dir string
	// MaxContentBytes is the Cost of a Flood answer: the driver's bound for
	// the plugin (--plugin ...,max-content-bytes). Default
	// plugin.DefaultMaxContentBytes.
	MaxContentBytes int64
	// TrickleRate is the bytes per second a Trickle plugin sends to the
	// driver. Default 256 KiB.
	TrickleRate int64
	// FlapPeriod is how long a Flap plugin's socket is up, and then gone.
	// Default 500ms.
	FlapPeriod time.Duration
	// RotateBytes is the size of a Rotate answer's "blob". Default 64 KiB.
	RotateBytes int64
}

func (o *Options) setDefaults() {
	if o.MaxContentBytes <= 0 {
		o.MaxContentBytes = plugin.DefaultMaxContentBytes
	}
	if o.TrickleRate <= 0 {
		o.TrickleRate = 256 << 10
	}
	if o.FlapPeriod <= 0 {
		o.FlapPeriod = 500 * time.Millisecond
	}
	if o.RotateBytes <= 0 {
		o.RotateBytes = 64 << 10
	}
}

// The environment of a plugin process (Options.Environ, FromEnv).
const (
	envMode       = "EPHEMERA_HOSTILE_MODE"
	envEndpoint   = "EPHEMERA_HOSTILE_ENDPOINT"
	envDir        = "EPHEMERA_HOSTILE_DIR"
	envMaxBytes   = "EPHEMERA_HOSTILE_MAX_CONTENT_BYTES"
	envRate       = "EPHEMERA_HOSTILE_TRICKLE_RATE"
	envFlapPeriod = "EPHEMERA_HOSTILE_FLAP_PERIOD"
	envRotate     = "EPHEMERA_HOSTILE_ROTATE_BYTES"
)

// Environ is o as the environment of a plugin process, for FromEnv.
func (o Options) Environ() []string {
	return []string{
		envMode + "=" + string(o.Mode), envEndpoint + "=" + o.Endpoint, envDir + "=" + o.Dir,
		envMaxBytes + "=" + strconv.FormatInt(o.MaxContentBytes, 10),
		envRate + "=" + strconv.FormatInt(o.TrickleRate, 10),
		envFlapPeriod + "=" + o.FlapPeriod.String(),
		envRotate + "=" + strconv.FormatInt(o.RotateBytes, 10),
	}
}

// FromEnv returns the Options of Environ, and whether this process is a
// hostile plugin at all.
func FromEnv() (Options, bool) {
	mode := os.Getenv(envMode)
	if mode == "" {
		return Options{}, false
	}
	o := Options{Mode: Mode(mode), Endpoint: os.Getenv(envEndpoint), Dir: os.Getenv(envDir)}
	o.MaxContentBytes, _ = strconv.ParseInt(os.Getenv(envMaxBytes), 10, 64)
	o.TrickleRate, _ = strconv.ParseInt(os.Getenv(envRate), 10, 64)
	o.FlapPeriod, _ = time.ParseDuration(os.Getenv(envFlapPeriod))
	o.RotateBytes, _ = strconv.ParseInt(os.Getenv(envRotate), 10, 64)
	return o, true
}

// Main serves the plugin of opts until SIGTERM or SIGINT and returns the
// process's exit status. The TestMain of a test binary that starts hostile
// plugins calls it first:
//
//	func TestMain(m *testing.M) {
//		if opts, ok := hostile.FromEnv(); ok {
//			os.Exit(hostile.Main(opts))
//		}
//		os.Exit(m.Run())
//	}
func Main(opts Options) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := Serve(ctx, opts); err != nil {
		fmt.Fprintf(os.Stderr, "hostile plugin %s: %v\n", opts.Mode, err)
		return 1
	}
	return 0
}

// Serve serves the plugin of opts on opts.Endpoint until ctx ends. A Crash
// plugin ends the process in its first Content answer.
func Serve(ctx context.Context, opts Options) error {
	opts.setDefaults()
	sock, ok := strings.CutPrefix(opts.Endpoint, "unix://")
	if !ok || !filepath.IsAbs(sock) {
		return fmt.Errorf("endpoint %q is not unix:///absolute/path.sock", opts.Endpoint)
	}
	srv := pluginserver.Options{Name: "hostile-" + string(opts.Mode), Version: "test", Endpoint: opts.Endpoint}
	var crashing atomic.Bool
	switch opts.Mode {
	case Healthy, Flap:
		srv.Content = framework.ContentFunc(healthyContent)
	case Rotate:
		var serial atomic.Int64
		srv.Content = framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			return rotated(v, serial.Add(1), opts.RotateBytes), nil
		})
	case Hang:
		srv.Content = framework.ContentFunc(func(ctx context.Context, _ *api.Volume) (map[string]api.File, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
	case Trickle:
		answer := filler("trickle", TrickleAnswerBytes)
		srv.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) { return answer, nil })
	case Flood:
		answer := filler("flood", int(opts.MaxContentBytes-content.Cost("flood", 0)))
		srv.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) { return answer, nil })
	case Crash:
		answer := filler("crash", CrashAnswerBytes)
		srv.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			crashing.Store(true)
			// Should the proxy never see the answer (a driver that went
			// away), the process dies anyway.
			time.AfterFunc(2*time.Second, func() { os.Exit(3) })
			return answer, nil
		})
	case Late:
		srv.Content = framework.ContentFunc(func(ctx context.Context, v *api.Volume) (map[string]api.File, error) {
			dl, ok := ctx.Deadline()
			if !ok {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			time.Sleep(time.Until(dl) + lateBy)
			return healthyContent(ctx, v)
		})
	case Dir, HangDelete:
		if opts.Dir == "" {
			return fmt.Errorf("mode %s needs Options.Dir", opts.Mode)
		}
		b, err := dir.New(dir.Options{Root: opts.Dir})
		if err != nil {
			return err
		}
		srv.Dir = opts.Dir
		srv.Backend = b
		if opts.Mode == HangDelete {
			srv.Backend = hangingDelete{b}
		}
	default:
		return fmt.Errorf("unknown mode %q", opts.Mode)
	}

	switch opts.Mode {
	case Trickle, Crash:
		// The plugin on a socket of its own; the driver's connection goes
		// through the proxy, which shapes what the plugin sends.
		inner := sock + ".in"
		srv.Endpoint = "unix://" + inner
		errc := make(chan error, 1)
		go func() { errc <- pluginserver.Serve(ctx, srv) }()
		if err := waitFor(ctx, inner, errc); err != nil {
			return err
		}
		p := &proxy{public: sock, inner: inner}
		if opts.Mode == Trickle {
			p.rate = opts.TrickleRate
		} else {
			p.crashing = &crashing
		}
		perr := p.serve(ctx)
		return errors.Join(perr, <-errc)
	case Flap:
		for ctx.Err() == nil {
			up, cancel := context.WithTimeout(ctx, opts.FlapPeriod)
			err := pluginserver.Serve(up, srv)
			cancel()
			if err != nil && ctx.Err() == nil {
				return err
			}
			select {
			case <-ctx.Done():
			case <-time.After(opts.FlapPeriod):
			}
		}
		return nil
	}
	return pluginserver.Serve(ctx, srv)
}

// waitFor waits until the socket path exists, or the server failed.
func waitFor(ctx context.Context, path string, errc <-chan error) error {
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case err := <-errc:
			return fmt.Errorf("serving on %s: %w", path, err)
		case <-ctx.Done():
			return nil
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// healthyContent is what a healthy plugin answers: the pod's name, the
// volume's ID and a 1.5 KiB certificate bundle, as a token or certificate
// provider writes.
func healthyContent(_ context.Context, v *api.Volume) (map[string]api.File, error) {
	return map[string]api.File{
		"pod":    {Data: []byte(v.Pod.Namespace + "/" + v.Pod.Name)},
		"volume": {Data: []byte(v.ID)},
		"ca.crt": {Data: bytes.Repeat([]byte("MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw\n"), 24)},
	}, nil
}

// rotated is a Rotate answer: every file differs from the answer of
// another serial.
func rotated(v *api.Volume, serial, blob int64) map[string]api.File {
	stamp := strconv.FormatInt(serial, 10) + "\n"
	b := bytes.Repeat([]byte(stamp), int(blob)/len(stamp)+1)[:blob]
	return map[string]api.File{
		"token":  {Data: []byte(RotateToken(v.Pod.Namespace+"/"+v.Pod.Name, v.ID, serial))},
		"ca.crt": {Data: append([]byte(stamp), bytes.Repeat([]byte("MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw\n"), 24)...)},
		"blob":   {Data: b},
	}
}

// RotateToken is the "token" of a Rotate answer.
func RotateToken(pod, volumeID string, serial int64) string {
	return pod + " " + volumeID + " " + strconv.FormatInt(serial, 10)
}

// RotateFiles are the names of the files a Rotate plugin writes.
var RotateFiles = []string{"token", "ca.crt", "blob"}

// HealthyFiles are the names of the files a healthy plugin writes.
var HealthyFiles = []string{"pod", "volume", "ca.crt"}

// filler is one file of n bytes.
func filler(name string, n int) map[string]api.File {
	return map[string]api.File{name: {Data: bytes.Repeat([]byte{'x'}, max(n, 0))}}
}

// hangingDelete is the dir backend whose Delete never answers.
type hangingDelete struct{ *dir.Backend }

func (hangingDelete) Delete(ctx context.Context, _ *api.Volume) error {
	<-ctx.Done()
	return ctx.Err()
}
