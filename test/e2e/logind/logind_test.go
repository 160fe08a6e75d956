//go:build linux

package logind

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

// startBus runs a private dbus-daemon with BusConfig and returns its address.
func startBus(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Skip("dbus-daemon not installed (Debian package dbus-daemon; test/e2e/install-deps.sh installs it)")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "bus.sock")
	cfg := filepath.Join(dir, "bus.conf")
	if err := os.WriteFile(cfg, []byte(BusConfig(sock)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--nofork", "--nopidfile", "--config-file="+cfg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	// Listening once a connection is accepted (the socket file comes first).
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return Address(sock)
		}
		if time.Now().After(deadline) {
			t.Fatalf("dbus-daemon does not accept connections on %s: %v\n%s", sock, err, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startLogind(t *testing.T, addr string, delay time.Duration) *Logind {
	t.Helper()
	l, err := Start(addr, Options{InhibitDelayMax: delay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// client is what the kubelet does (pkg/kubelet/nodeshutdown/systemd): a
// connection to the bus, the property, the lock, the signal.
type client struct {
	conn    *dbus.Conn
	signals chan *dbus.Signal
}

func newClient(t *testing.T, addr string) *client {
	t.Helper()
	conn, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.AddMatchSignal(dbus.WithMatchInterface(ManagerInterface), dbus.WithMatchMember("PrepareForShutdown"), dbus.WithMatchObjectPath(ObjectPath)); err != nil {
		t.Fatal(err)
	}
	c := &client{conn: conn, signals: make(chan *dbus.Signal, 4)}
	conn.Signal(c.signals)
	return c
}

func (c *client) inhibit(what, mode string) (int, error) {
	call := c.conn.Object(Service, ObjectPath).Call(ManagerInterface+".Inhibit", 0, what, "kubelet", "Kubelet needs time to handle node shutdown", mode)
	if call.Err != nil {
		return -1, call.Err
	}
	// Stored as the kubelet stores it.
	var fd uint32
	if err := call.Store(&fd); err != nil {
		return -1, err
	}
	return int(fd), nil
}

func (c *client) nextSignal(t *testing.T) bool {
	t.Helper()
	select {
	case s := <-c.signals:
		if len(s.Body) != 1 {
			t.Fatalf("PrepareForShutdown with body %v", s.Body)
		}
		v, ok := s.Body[0].(bool)
		if !ok {
			t.Fatalf("PrepareForShutdown with body %v, want one bool", s.Body)
		}
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("no PrepareForShutdown signal within 5s")
		return false
	}
}

func TestInhibitDelayMaxUSec(t *testing.T) {
	addr := startBus(t)
	startLogind(t, addr, 45*time.Second)
	c := newClient(t, addr)
	v, err := c.conn.Object(Service, ObjectPath).GetProperty(ManagerInterface + ".InhibitDelayMaxUSec")
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := v.Value().(uint64); !ok || got != 45_000_000 {
		t.Fatalf("InhibitDelayMaxUSec = %v (%T), want uint64 45000000", v.Value(), v.Value())
	}
	_, err = c.conn.Object(Service, ObjectPath).GetProperty(ManagerInterface + ".NoSuchProperty")
	var de dbus.Error
	if !errors.As(err, &de) || de.Name != "org.freedesktop.DBus.Error.UnknownProperty" {
		t.Fatalf("unknown property: %v, want org.freedesktop.DBus.Error.UnknownProperty", err)
	}
}

func TestSecondInstanceRefused(t *testing.T) {
	addr := startBus(t)
	startLogind(t, addr, time.Second)
	if l, err := Start(addr, Options{}); err == nil {
		l.Close()
		t.Fatal("a second stand-in got org.freedesktop.login1")
	}
}

// TestShutdownWaitsForTheLock: PrepareForShutdown(true) reaches the holder, and
// Shutdown returns when the holder closes its descriptor, not before: the
// stand-in keeps no copy of it.
func TestShutdownWaitsForTheLock(t *testing.T) {
	addr := startBus(t)
	l := startLogind(t, addr, 10*time.Second)
	c := newClient(t, addr)
	since := time.Now()
	fd, err := c.inhibit("shutdown", "delay")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	x, err := l.WaitInhibitor(ctx, "kubelet", since)
	if err != nil {
		t.Fatal(err)
	}
	if x.What != "shutdown" || x.Mode != "delay" || x.Sender != c.conn.Names()[0] {
		t.Fatalf("inhibitor %+v, want shutdown/delay from %s", x, c.conn.Names()[0])
	}
	type out struct {
		res Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := l.Shutdown(t.Context())
		done <- out{res, err}
	}()
	if !c.nextSignal(t) {
		t.Fatal("PrepareForShutdown(false), want true")
	}
	select {
	case o := <-done:
		t.Fatalf("Shutdown returned while the lock was held: %+v, %v", o.res, o.err)
	case <-time.After(300 * time.Millisecond):
	}
	closed := time.Now()
	if err := syscall.Close(fd); err != nil {
		t.Fatal(err)
	}
	var o out
	select {
	case o = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return within 5s of the lock's release")
	}
	if o.err != nil || o.res.TimedOut || len(o.res.Waited) != 1 || o.res.Waited[0].Held() {
		t.Fatalf("Shutdown: %+v, %v, want the one lock released", o.res, o.err)
	}
	if o.res.Done.Before(closed) || o.res.Done.Sub(closed) > time.Second {
		t.Fatalf("released at %v, the descriptor closed at %v", o.res.Done, closed)
	}

	// Cancelled: the holder hears it and takes a new lock.
	if err := l.Cancel(); err != nil {
		t.Fatal(err)
	}
	if c.nextSignal(t) {
		t.Fatal("PrepareForShutdown(true), want false")
	}
	if _, err := c.inhibit("shutdown", "delay"); err != nil {
		t.Fatal(err)
	}
	if n := len(l.Inhibitors()); n != 2 {
		t.Fatalf("%d inhibitors, want 2", n)
	}
}

func TestShutdownTimesOut(t *testing.T) {
	addr := startBus(t)
	l := startLogind(t, addr, 500*time.Millisecond)
	c := newClient(t, addr)
	fd, err := c.inhibit("sleep:shutdown", "delay")
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	// A block lock and a delay lock on sleep only are not waited for.
	if _, err := c.inhibit("shutdown", "block"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.inhibit("sleep", "delay"); err != nil {
		t.Fatal(err)
	}
	res, err := l.Shutdown(t.Context())
	if err != nil || !res.TimedOut || len(res.Waited) != 1 || !res.Waited[0].Held() {
		t.Fatalf("Shutdown: %+v, %v, want a timeout with the one delay lock on shutdown held", res, err)
	}
	if d := res.Done.Sub(res.Announced); d < 500*time.Millisecond || d > 3*time.Second {
		t.Fatalf("timed out after %v, want InhibitDelayMax (500ms)", d)
	}
}

func TestShutdownWithoutLock(t *testing.T) {
	addr := startBus(t)
	l := startLogind(t, addr, time.Second)
	c := newClient(t, addr)
	if _, err := l.Shutdown(t.Context()); !errors.Is(err, ErrNoDelayLock) {
		t.Fatalf("Shutdown without a lock: %v, want ErrNoDelayLock", err)
	}
	if !c.nextSignal(t) {
		t.Fatal("PrepareForShutdown(false), want true")
	}
}

func TestInhibitRefusesBadArguments(t *testing.T) {
	addr := startBus(t)
	l := startLogind(t, addr, time.Second)
	c := newClient(t, addr)
	for _, tc := range []struct{ what, mode string }{{"shutdown", "later"}, {"reboot", "delay"}, {"", "delay"}} {
		_, err := c.inhibit(tc.what, tc.mode)
		var de dbus.Error
		if !errors.As(err, &de) || de.Name != "org.freedesktop.DBus.Error.InvalidArgs" {
			t.Errorf("Inhibit(%q, %q): %v, want org.freedesktop.DBus.Error.InvalidArgs", tc.what, tc.mode, err)
		}
	}
	if n := len(l.Inhibitors()); n != 0 {
		t.Fatalf("%d inhibitors after refused calls", n)
	}
	err := c.conn.Object(Service, ObjectPath).Call(ManagerInterface+".PowerOff", 0, false).Err
	var de dbus.Error
	if !errors.As(err, &de) || de.Name != "org.freedesktop.DBus.Error.UnknownMethod" {
		t.Fatalf("PowerOff: %v, want org.freedesktop.DBus.Error.UnknownMethod", err)
	}
}
