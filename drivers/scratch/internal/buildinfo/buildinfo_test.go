package buildinfo

import (
	"bytes"
	"runtime"
	"testing"
)

func TestPrint(t *testing.T) {
	var out bytes.Buffer
	Info{Version: "v1.2.3", Commit: "abc123-dirty", BuildTime: "2026-01-02T03:04:05Z", GoVersion: "go1.26.8", Platform: "linux/amd64"}.Print(&out, "x")
	if want := "x v1.2.3\ngit commit: abc123-dirty\ncommit time: 2026-01-02T03:04:05Z\ngo: go1.26.8 linux/amd64\n"; out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	Info{Version: "dev", GoVersion: "go1.26.8", Platform: "linux/amd64"}.Print(&out, "x")
	if want := "x dev\ngit commit: unknown (built without VCS information)\ngo: go1.26.8 linux/amd64\n"; out.String() != want {
		t.Errorf("without VCS information: got\n%s\nwant\n%s", out.String(), want)
	}
}

// A test binary has no VCS stamp and its main module is "(devel)": the
// -ldflags values stand.
func TestRead(t *testing.T) {
	b := Read("v9.8.7", "0123abcd")
	if b.Version != "v9.8.7" || b.Commit != "0123abcd" || b.GoVersion != runtime.Version() || b.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("Read = %+v", b)
	}
}
