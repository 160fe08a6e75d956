// Command release writes a release of Ephemera into -out (make release; docs/operations.md,
// "Releases"): make image's index as an OCI layout archive named for containerd, its
// SBOMs, the chart packaged, the kustomize bundle naming the index by version and
// digest, the kubectl plugin's archives with a krew manifest, the module as a
// file-based Go module proxy, release notes from docs/changelog.md and SHA256SUMS.
// Then it checks what it wrote (manifests.CheckRelease): every image of the
// manifests and of the chart resolves inside the archive.
//
//	go run ./cmd/release -version v0.3.0 -image-layout ../../_output/image -image-repo REPO \
//	  -release-url URL -revision COMMIT -source-date-epoch SECONDS -plugin linux/amd64=FILE ... -out DIR
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ephemera-csi/ephemera/test/manifests"
)

func main() {
	var r manifests.Release
	flag.StringVar(&r.Version, "version", "", "the release's version (vX.Y.Z; anything else makes a test bundle, its module a pseudo-version)")
	flag.StringVar(&r.ImageLayout, "image-layout", "", "make image's OCI layout (its SBOM files in LAYOUT.sbom/)")
	flag.StringVar(&r.ImageRepo, "image-repo", manifests.PlaceholderImage, "the repository the index is named in the archive and the manifests")
	flag.StringVar(&r.ReleaseURL, "release-url", "", "where the release's files are downloadable (the krew manifest's URIs)")
	flag.StringVar(&r.Revision, "revision", "", "the commit (the module zip is made of it)")
	flag.StringVar(&r.Out, "out", "", "the directory to write (made anew)")
	epoch := flag.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "every timestamp of the archives, in seconds (the commit's time)")
	r.Plugins = map[string]string{}
	flag.Func("plugin", "OS/ARCH=FILE: the kubectl-ephemera binary of a platform (repeatable)", func(v string) error {
		p, f, ok := strings.Cut(v, "=")
		if !ok || f == "" {
			return fmt.Errorf("want OS/ARCH=FILE")
		}
		r.Plugins[p] = f
		return nil
	})
	flag.Parse()
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil || r.Out == "" || r.ImageLayout == "" {
		fmt.Fprintln(os.Stderr, "release: -out, -image-layout and -source-date-epoch (seconds) are required")
		os.Exit(2)
	}
	r.Epoch = time.Unix(secs, 0).UTC()
	root, err := manifests.RepoRoot()
	if err != nil {
		fail(err)
	}
	r.Root = root
	digest, err := r.Build()
	if err != nil {
		fail(err)
	}
	platforms := make([]string, 0, len(r.Plugins))
	for p := range r.Plugins {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)
	a, err := manifests.CheckRelease(r.Out, manifests.Expect{
		Version: r.Version, ImageRepo: r.ImageRepo, ReleaseURL: r.ReleaseURL,
		Root: root, Revision: r.Revision, Epoch: r.Epoch, PluginPlatforms: platforms,
	})
	if err != nil {
		fail(fmt.Errorf("the release in %s does not check out:\n%w", r.Out, err))
	}
	fmt.Printf("release %s in %s: image %s@%s (%d platforms, %d SBOMs), chart %s, module %s@%s, kubectl plugin for %s\n",
		r.Version, r.Out, a.Name, digest, len(a.Images), len(a.SBOMs), r.ChartArchive(), manifests.Module, r.ModuleVersion(), strings.Join(platforms, " "))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "release:", err)
	os.Exit(1)
}
