package main

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"text/template"

	"golang.org/x/mod/module"

	"github.com/ephemera-csi/ephemera/api"
)

// sdkModule is the SDK's module path.
const sdkModule = "github.com/ephemera-csi/ephemera"

// The kinds of driver new writes.
const (
	kindContent = "content"
	kindLoop    = "loop"
	kindPlugin  = "plugin"
)

var kinds = []string{kindContent, kindLoop, kindPlugin}

// templates are the files of a new module: common/ for every kind, then the
// kind's directory. A file's path is its path in the module, ".tmpl"
// dropped and NAME replaced by the binary's name.
//
//go:embed all:templates
var templates embed.FS

// config is one run of new: the flags and arguments, then what resolve
// derives from them.
type config struct {
	Module     string // the new module's path
	Dir        string // where it goes
	Kind       string // kindContent, kindLoop or kindPlugin
	DriverName string // the CSI driver name
	Name       string // the binary, image and plugin name
	Image      string // the image repository
	SDKVersion string // the SDK version go.mod requires
	Replace    string // a checkout of the SDK, absolute; "" none

	// Derived by resolve.
	AdmissionLabel string // the namespace label the admission policy asks for
	Packages       string // Debian packages of the image (comma-separated)
	EnvPrefix      string // Name as an environment variable's prefix
	GoVersion      string // go.mod's go line
	fromBuild      bool   // SDKVersion is the version this command was built from
}

// dnsLabel is an RFC 1123 label: a container's name (the chart's plugin
// sidecar), a backend's name, a file and an image name.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// imageRepository is an image repository without tag or digest, as the
// distribution spec names one: a registry host (a port allowed) and
// lower-case path components.
var imageRepository = regexp.MustCompile(`^[a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?(:[0-9]+)?(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)+$`)

// develVersion reports whether v names no version a proxy serves: a build
// in a checkout ("(devel)", or a pseudo-version of a modified tree).
func develVersion(v string) bool {
	return v == "" || strings.HasPrefix(v, "(devel)") || strings.Contains(v, "+dirty")
}

// resolve checks the configuration and fills in the defaults; every problem
// is reported at once, each saying what to do.
func (c *config) resolve(buildVersion string) error {
	var errs []error
	if !slices.Contains(kinds, c.Kind) {
		errs = append(errs, fmt.Errorf("-kind %q: want one of %s", c.Kind, strings.Join(kinds, ", ")))
	}
	modOK := false
	switch err := module.CheckPath(c.Module); {
	case err != nil:
		errs = append(errs, fmt.Errorf("%v (a module path looks like example.com/whoami or github.com/you/whoami)", err))
	case c.Module == sdkModule || strings.HasPrefix(c.Module, sdkModule+"/"):
		errs = append(errs, fmt.Errorf("module path %q is inside the SDK's own module %s: choose your own, e.g. example.com/whoami", c.Module, sdkModule))
	default:
		modOK = true
	}
	if c.DriverName != "" {
		if err := api.ValidateDriverName(c.DriverName); err != nil {
			errs = append(errs, fmt.Errorf("-driver-name %v", err))
		}
	}
	if c.Name != "" && !dnsLabel.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("-name %q: want at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit (it names the binary, the image and the plugin)", c.Name))
	}
	if modOK {
		if c.Name == "" {
			c.Name = defaultName(c.Module)
			if !dnsLabel.MatchString(c.Name) {
				errs = append(errs, fmt.Errorf("the name %q (the module path's last element) cannot name the binary, image and plugin: pass -name with at most 63 lower-case letters, digits and '-'", c.Name))
			}
		}
		if c.DriverName == "" {
			c.DriverName = defaultDriverName(c.Module)
			if err := api.ValidateDriverName(c.DriverName); err != nil {
				errs = append(errs, fmt.Errorf("the driver name derived from the module path, %v: pass -driver-name", err))
			}
		}
		if c.Dir == "" {
			c.Dir = defaultName(c.Module)
		}
	}
	if c.Kind == kindPlugin && slices.Contains([]string{"tmpfs", "dir", "loop", "vhdx"}, c.Name) {
		errs = append(errs, fmt.Errorf("-name %q: a plugin's name is a backend's name, and %q is the scratch driver's own; pass another -name", c.Name, c.Name))
	}
	if c.Image == "" && c.Name != "" {
		c.Image = "registry.example.com/" + c.Name
	} else if c.Image != "" && !imageRepository.MatchString(c.Image) {
		errs = append(errs, fmt.Errorf("-image %q: want an image repository without tag or digest, a registry and lower-case path, like registry.example.com/%s (make image names the archive's image REPOSITORY:VERSION, the chart's values the tag)", c.Image, c.Name))
	}
	if c.Replace != "" {
		abs, err := filepath.Abs(c.Replace)
		if err == nil {
			c.Replace = abs
			err = checkCheckout(abs)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("-replace: %v", err))
		}
	}
	switch {
	case c.SDKVersion != "":
		if !strings.HasPrefix(c.SDKVersion, "v") || module.Check(sdkModule, c.SDKVersion) != nil {
			errs = append(errs, fmt.Errorf("-sdk %q: want a version of %s, e.g. v0.3.0", c.SDKVersion, sdkModule))
		}
	case c.Replace != "":
		c.SDKVersion = "v0.0.0" // a placeholder: the replace decides
	case develVersion(buildVersion):
		errs = append(errs, fmt.Errorf("this ephemera was built from a checkout (version %q), so it cannot tell which SDK version to require: pass -sdk VERSION (a release), or -replace DIR (a checkout of the SDK to build against)", buildVersion))
	default:
		c.SDKVersion, c.fromBuild = buildVersion, true
	}
	if c.Dir != "" {
		if err := checkDir(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	c.AdmissionLabel = admissionLabel(c.DriverName)
	if c.Kind == kindLoop {
		c.Packages = "e2fsprogs"
	}
	c.GoVersion = goVersion()
	c.EnvPrefix = strings.ToUpper(strings.ReplaceAll(c.Name, "-", "_"))
	return nil
}

// defaultName is the module path's last element without a major version
// suffix: example.com/whoami/v2 is whoami.
func defaultName(mod string) string {
	prefix, _, _ := module.SplitPathVersion(mod)
	return strings.ToLower(path.Base(prefix))
}

// defaultDriverName is the module path reversed as a domain:
// example.com/whoami is whoami.example.com, github.com/acme/whoami
// whoami.acme.github.com. Characters a driver name cannot hold become '-'.
func defaultDriverName(mod string) string {
	prefix, _, _ := module.SplitPathVersion(mod)
	elems := strings.Split(prefix, "/")
	slices.Reverse(elems[1:])
	labels := append(elems[1:], elems[0])
	name := strings.ToLower(strings.Join(labels, "."))
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, name)
}

// admissionLabel is the namespace label the chart's admission policy asks
// for: whoami.example.com's is example.com/whoami-allowed (the pattern of
// ephemera.dev/scratch-allowed), or whoami.example.com/allowed when that is
// too long for a label's name.
func admissionLabel(driverName string) string {
	first, rest, _ := strings.Cut(driverName, ".")
	name := first + "-allowed"
	if rest == "" {
		if len(name) <= 63 {
			return name
		}
		return driverName + "/allowed"
	}
	if len(name) > 63 {
		return driverName + "/allowed"
	}
	return rest + "/" + name
}

// goVersion is the go line of the new go.mod: the toolchain's that built
// this command (the SDK's go line at least; go mod tidy raises it when a
// dependency needs more).
func goVersion() string {
	v := strings.TrimPrefix(runtime.Version(), "go")
	if v, _, _ = strings.Cut(v, " "); regexp.MustCompile(`^1\.\d+(\.\d+)?$`).MatchString(v) {
		return v
	}
	return "1.26.8"
}

// checkCheckout refuses a directory that holds no checkout of the SDK.
func checkCheckout(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return fmt.Errorf("%s is no checkout of %s: %v", dir, sdkModule, err)
	}
	if !regexp.MustCompile(`(?m)^module\s+` + regexp.QuoteMeta(sdkModule) + `\s*$`).Match(data) {
		return fmt.Errorf("%s/go.mod is not the module %s: give the root of a checkout", dir, sdkModule)
	}
	return nil
}

// checkDir refuses a directory new must not write into: one that exists
// and is not empty, or a file.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%s exists and is not a directory: give another DIR", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s exists and is not empty (%d entries, e.g. %s): new writes only into a new or empty directory; give another DIR, or remove what is there", dir, len(entries), entries[0].Name())
	}
	return nil
}

// sdkSummary says which SDK the module builds against.
func (c *config) sdkSummary() string {
	switch {
	case c.Replace != "":
		return "SDK " + c.Replace + " (replace)"
	case c.fromBuild:
		return "SDK " + c.SDKVersion + ", this command's version"
	}
	return "SDK " + c.SDKVersion
}

// write renders the templates into c.Dir and writes go.mod; it returns the
// files written, relative to c.Dir.
func (c *config) write() ([]string, error) {
	files := map[string][]byte{"go.mod": c.goMod()}
	for _, root := range []string{"templates/common", "templates/" + c.Kind} {
		err := fs.WalkDir(templates, root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			t, err := template.New(path.Base(p)).Option("missingkey=error").ParseFS(templates, p)
			if err != nil {
				return err
			}
			var b bytes.Buffer
			if err := t.Execute(&b, c); err != nil {
				return err
			}
			rel := strings.TrimSuffix(strings.TrimPrefix(p, root+"/"), ".tmpl")
			files[strings.ReplaceAll(rel, "NAME", c.Name)] = b.Bytes()
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("rendering the templates: %v", err)
		}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	for _, n := range names {
		p := filepath.Join(c.Dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		mode := fs.FileMode(0o644)
		if strings.HasPrefix(n, ".ci/") {
			mode = 0o755
		}
		if err := os.WriteFile(p, files[n], mode); err != nil {
			return nil, err
		}
	}
	return names, nil
}

// goMod is the new go.mod: the SDK required (and replaced by a checkout);
// go mod tidy adds the rest.
func (c *config) goMod() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "module %s\n\ngo %s\n\nrequire %s %s\n", c.Module, c.GoVersion, sdkModule, c.SDKVersion)
	if c.Replace != "" {
		fmt.Fprintf(&b, "\n// A checkout of the SDK (ephemera new -replace): the version above is a\n// placeholder. Drop this (go mod edit -dropreplace %s) to build\n// against a release.\nreplace %s => %s\n", sdkModule, sdkModule, c.Replace)
	}
	return b.Bytes()
}

// tidy runs go mod tidy in the new module: it adds the requirements the
// code imports beside the SDK's (klog) and writes go.sum.
func (c *config) tidy(out io.Writer) error {
	cmd := exec.Command("go", "mod", "tidy")
	cmd.Dir = c.Dir
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go mod tidy in %s: %v", c.Dir, err)
	}
	return nil
}
