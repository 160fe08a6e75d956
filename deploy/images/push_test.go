package main

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestShippedPush pushes make image's layout to go-containerregistry's in-memory
// registry on loopback and reads the index back by tag: the digest make image
// printed, every platform image and SBOM there. (The e2e's
// TestShippedImageMigration pushes it to a real one, distribution 2.8 over TLS,
// and containerd pulls it from there.)
func TestShippedPush(t *testing.T) {
	idx, c := shipped(t)
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	to := strings.TrimPrefix(srv.URL, "http://") + "/ephemera-scratch:" + c.Version
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	if err := runPush([]string{"-layout", os.Getenv("EPHEMERA_IMAGE_LAYOUT"), "-to", to, "-insecure"}); err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(to, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	d, err := got.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d != want {
		t.Fatalf("pushed index %s, make image's %s", d, want)
	}
	m, err := got.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, desc := range m.Manifests {
		if _, err := got.Image(desc.Digest); err != nil {
			t.Errorf("%s (%v) not readable from the registry: %v", desc.Digest, desc.Platform, err)
		}
	}
}
