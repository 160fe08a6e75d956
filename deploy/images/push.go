package main

import (
	"errors"
	"flag"
	"fmt"

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
	if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return err
	}
	fmt.Printf("pushed %s@%s\n", ref, m.Manifests[0].Digest)
	return nil
}
