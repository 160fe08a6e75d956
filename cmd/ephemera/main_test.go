package main

import (
	"bytes"
	"go/format"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// checkout is the root of this checkout of the SDK, for -replace.
func checkout(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// ephemera runs the command line in this process.
func ephemera(t *testing.T, version string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb, version)
	return code, out.String(), errb.String()
}

func TestDefaultNames(t *testing.T) {
	for _, tc := range []struct{ module, name, driver, label string }{
		{"example.com/whoami", "whoami", "whoami.example.com", "example.com/whoami-allowed"},
		{"github.com/acme/whoami", "whoami", "whoami.acme.github.com", "acme.github.com/whoami-allowed"},
		{"example.com/whoami/v2", "whoami", "whoami.example.com", "example.com/whoami-allowed"},
		{"example.com/Who_Ami", "who_ami", "who-ami.example.com", "example.com/who-ami-allowed"},
		{"whoami.dev", "whoami.dev", "whoami.dev", "dev/whoami-allowed"},
	} {
		if got := defaultName(tc.module); got != tc.name {
			t.Errorf("defaultName(%q) = %q, want %q", tc.module, got, tc.name)
		}
		if got := defaultDriverName(tc.module); got != tc.driver {
			t.Errorf("defaultDriverName(%q) = %q, want %q", tc.module, got, tc.driver)
		}
		if got := admissionLabel(tc.driver); got != tc.label {
			t.Errorf("admissionLabel(%q) = %q, want %q", tc.driver, got, tc.label)
		}
	}
	long := strings.Repeat("a", 60) + ".example.com"
	if got := admissionLabel(long); got != long+"/allowed" {
		t.Errorf("admissionLabel(%q) = %q, want the driver name as the prefix", long, got)
	}
	if got := admissionLabel("whoami"); got != "whoami-allowed" {
		t.Errorf("admissionLabel(whoami) = %q", got)
	}
}

// TestUsage: help lists the commands; bad usage exits 2 with the usage.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, _ := ephemera(t, "v0.3.0", args...)
		if code != 0 || !strings.Contains(out, "new ") || !strings.Contains(out, "version ") {
			t.Errorf("ephemera %s: exit %d, %q; want 0 and the commands", args, code, out)
		}
	}
	if code, _, errs := ephemera(t, "v0.3.0", "new", "-h"); code != 0 || !strings.Contains(errs, "-kind") || !strings.Contains(errs, "Usage: ephemera new") {
		t.Errorf("ephemera new -h: exit %d, %q; want 0 and new's flags", code, errs)
	}
	if code, out, _ := ephemera(t, "v0.3.0", "version"); code != 0 || out != "v0.3.0\n" {
		t.Errorf("ephemera version: exit %d, %q", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Commands:"},
		{[]string{"nwe"}, `unknown command "nwe"`},
		{[]string{"new"}, "the module path is missing"},
		{[]string{"new", "-bogus", "example.com/x"}, "flag provided but not defined: -bogus"},
		{[]string{"new", "example.com/x", "a", "b"}, "too many arguments: b"},
	} {
		code, _, errs := ephemera(t, "v0.3.0", tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) || !strings.Contains(errs, "sage") {
			t.Errorf("ephemera %s: exit %d, %q; want 2, %q and the usage", tc.args, code, errs, tc.want)
		}
	}
}

// TestNewRefuses: each bad input exits 2 with a message that says what to
// do, and writes nothing.
func TestNewRefuses(t *testing.T) {
	root := checkout(t)
	tmp := t.TempDir()
	full := filepath.Join(tmp, "full")
	if err := os.MkdirAll(filepath.Join(full, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(tmp, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tmp, "new")
	long := "example.com/" + strings.Repeat("x", 60)
	for _, tc := range []struct {
		name    string
		version string
		args    []string
		want    []string
	}{
		{"devel without -sdk", "(devel)", []string{"example.com/whoami", dir}, []string{"built from a checkout", "-sdk VERSION", "-replace DIR"}},
		{"dirty build", "v0.3.1-0.20261207120000-abcdefabcdef+dirty", []string{"example.com/whoami", dir}, []string{"built from a checkout"}},
		{"checkout's commit", "(devel) v0.3.1-0.20261207120000-abcdefabcdef", []string{"example.com/whoami", dir}, []string{"built from a checkout"}},
		{"bad module path", "v0.3.0", []string{"example.com/who ami", dir}, []string{`malformed module path "example.com/who ami"`, "invalid char ' '"}},
		{"module without a dot", "v0.3.0", []string{"whoami", dir}, []string{`"whoami"`, "missing dot in first path element"}},
		{"inside the SDK", "v0.3.0", []string{"github.com/ephemera-csi/ephemera/drivers/x", dir}, []string{"inside the SDK's own module"}},
		{"bad driver name", "v0.3.0", []string{"-driver-name", "Motd_Driver", "example.com/whoami", dir}, []string{`-driver-name "Motd_Driver" is not a valid CSI driver name`, "upper-case letters", `"motd-driver" would be accepted`}},
		{"64-character driver name", "v0.3.0", []string{"-driver-name", strings.Repeat("a", 64), "example.com/whoami", dir}, []string{"64 characters long"}},
		{"derived driver name too long", "v0.3.0", []string{long, dir}, []string{"the driver name derived from the module path", "72 characters long", "pass -driver-name"}},
		{"bad name", "v0.3.0", []string{"-name", "Who_Ami", "example.com/whoami", dir}, []string{`-name "Who_Ami"`}},
		{"derived name", "v0.3.0", []string{"example.com/Who_Ami", dir}, []string{`the name "who_ami"`, "pass -name"}},
		{"plugin named tmpfs", "v0.3.0", []string{"-kind", "plugin", "example.com/tmpfs", dir}, []string{`-name "tmpfs"`, "scratch driver's own"}},
		{"bad image", "v0.3.0", []string{"-image", "registry.example.com/whoami:v1", "example.com/whoami", dir}, []string{`-image "registry.example.com/whoami:v1": want an image repository without tag or digest`}},
		{"bad kind", "v0.3.0", []string{"-kind", "nfs", "example.com/whoami", dir}, []string{`-kind "nfs": want one of content, loop, plugin`}},
		{"bad -sdk", "(devel)", []string{"-sdk", "latest", "example.com/whoami", dir}, []string{`-sdk "latest"`}},
		{"-replace no checkout", "(devel)", []string{"-replace", tmp, "example.com/whoami", dir}, []string{"-replace", "no checkout"}},
		{"-replace another module", "(devel)", []string{"-replace", filepath.Join(root, "examples/hello"), "example.com/whoami", dir}, []string{"is not the module github.com/ephemera-csi/ephemera"}},
		{"non-empty directory", "v0.3.0", []string{"example.com/whoami", full}, []string{full + " exists and is not empty", "src", "give another DIR"}},
		{"a file", "v0.3.0", []string{"example.com/whoami", file}, []string{file + " exists and is not a directory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := ephemera(t, tc.version, append([]string{"new", "-tidy=false"}, tc.args...)...)
			if code != 2 {
				t.Errorf("exit %d, want 2 (stdout %q)", code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr %q, want it to say %q", errs, w)
				}
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("%s written: %v", dir, err)
			}
			if entries, _ := os.ReadDir(full); len(entries) != 1 {
				t.Errorf("%s changed: %d entries", full, len(entries))
			}
		})
	}
}

// TestNewWrites: what new writes for each kind, without building it (the
// build is TestScaffoldBuilds'): the files, gofmt'd Go, the SDK version in
// go.mod, and deploy files that say what the driver is.
func TestNewWrites(t *testing.T) {
	chartValues := readYAML(t, filepath.Join(checkout(t), "deploy/helm/ephemera-driver/values.yaml"))
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "whoami")
			if err := os.Mkdir(dir, 0o755); err != nil { // an empty directory is fine
				t.Fatal(err)
			}
			// Flags after the arguments are taken too.
			code, out, errs := ephemera(t, "v0.3.0", "new", "-tidy=false", "-kind", kind, "example.com/whoami", dir, "-image", "ghcr.io/acme/whoami")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			want := []string{".ci/run", ".dockerignore", ".gitignore", "Dockerfile", "Makefile", "README.md",
				"deploy/csidriver.yaml", "deploy/pod.yaml", "deploy/values.yaml", "go.mod", "main.go", "main_test.go", "whoami_linux_test.go"}
			var got []string
			err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					rel, _ := filepath.Rel(dir, p)
					got = append(got, filepath.ToSlash(rel))
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("files %q, want %q", got, want)
			}
			for _, f := range want {
				if !strings.Contains(out, "  "+f+"\n") {
					t.Errorf("stdout does not list %s: %s", f, out)
				}
			}
			for _, f := range got {
				data, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(data), "<no value>") {
					t.Errorf("%s: a template field without a value", f)
				}
				if strings.HasSuffix(f, ".go") {
					if formatted, err := format.Source(data); err != nil || !bytes.Equal(formatted, data) {
						t.Errorf("%s is not gofmt'd (%v)", f, err)
					}
				}
			}
			if fi, err := os.Stat(filepath.Join(dir, ".ci/run")); err != nil || fi.Mode().Perm()&0o100 == 0 {
				t.Errorf(".ci/run is not executable: %v", err)
			}
			if gomod := readFile(t, dir, "go.mod"); !strings.Contains(gomod, "module example.com/whoami\n") ||
				!strings.Contains(gomod, "require github.com/ephemera-csi/ephemera v0.3.0\n") || strings.Contains(gomod, "replace") {
				t.Errorf("go.mod:\n%s", gomod)
			}
			if mk := readFile(t, dir, "Makefile"); !strings.Contains(mk, "IMAGE     ?= ghcr.io/acme/whoami") ||
				!strings.Contains(mk, "go run github.com/ephemera-csi/ephemera/deploy/images@$(EPHEMERA_VERSION)") ||
				!strings.Contains(mk, "build -main . -name $(NAME)") || !strings.Contains(mk, "-platforms $(PLATFORMS)") ||
				!strings.Contains(mk, "-out $(LAYOUT) -archive $(ARCHIVE)") {
				t.Errorf("Makefile:\n%s", mk)
			}
			if pkgs := kind == kindLoop; strings.Contains(readFile(t, dir, "Makefile"), "PACKAGES  ?= e2fsprogs") != pkgs {
				t.Errorf("Makefile: PACKAGES e2fsprogs is %v, want %v", !pkgs, pkgs)
			}
			if main := readFile(t, dir, "main.go"); kind != kindPlugin && !strings.Contains(main, "framework.BindFlags(flag.CommandLine, &opts)") {
				t.Errorf("main.go binds no framework flags:\n%s", main)
			}

			csi := readYAML(t, filepath.Join(dir, "deploy/csidriver.yaml"))
			spec, _ := csi["spec"].(map[string]any)
			if csi["kind"] != "CSIDriver" || dig(csi, "metadata", "name") != "whoami.example.com" || spec["podInfoOnMount"] != true ||
				!slices.Equal(toStrings(spec["volumeLifecycleModes"]), []string{"Ephemeral"}) || spec["attachRequired"] != false {
				t.Errorf("csidriver.yaml: %v", csi)
			}
			values := readYAML(t, filepath.Join(dir, "deploy/values.yaml"))
			if dig(values, "driver", "name") != "whoami.example.com" || dig(values, "admission", "namespaceLabel", "key") != "example.com/whoami-allowed" {
				t.Errorf("values.yaml: %v", values)
			}
			image := dig(values, "image", "repository")
			if kind == kindPlugin {
				plugins, _ := values["plugins"].([]any)
				if len(plugins) != 1 || dig(plugins[0].(map[string]any), "name") != "whoami" {
					t.Errorf("values.yaml plugins: %v", values["plugins"])
				} else {
					image = dig(plugins[0].(map[string]any), "image", "repository")
				}
			}
			if image != "ghcr.io/acme/whoami" {
				t.Errorf("values.yaml: image %v", image)
			}
			// The chart's schema refuses keys its values.yaml does not have.
			for _, k := range unknownKeys(values, chartValues, "") {
				t.Errorf("values.yaml: %s is not a value of the chart", k)
			}
			pod := readYAML(t, filepath.Join(dir, "deploy/pod.yaml"))
			if vols, _ := dig(pod, "spec", "volumes").([]any); len(vols) != 1 || dig(vols[0].(map[string]any), "csi", "driver") != "whoami.example.com" {
				t.Errorf("pod.yaml: %v", pod)
			}
		})
	}
}

// TestNewVersions: go.mod requires the version new was built from, -sdk's,
// or a checkout's placeholder with its replace.
func TestNewVersions(t *testing.T) {
	root := checkout(t)
	for _, tc := range []struct {
		version string
		args    []string
		want    []string
	}{
		{"v0.3.0", nil, []string{"require github.com/ephemera-csi/ephemera v0.3.0\n"}},
		{"v0.3.0", []string{"-sdk", "v0.4.1"}, []string{"require github.com/ephemera-csi/ephemera v0.4.1\n"}},
		{"(devel)", []string{"-sdk", "v0.4.1"}, []string{"require github.com/ephemera-csi/ephemera v0.4.1\n"}},
		{"(devel)", []string{"-replace", root}, []string{"require github.com/ephemera-csi/ephemera v0.0.0\n", "replace github.com/ephemera-csi/ephemera => " + root + "\n"}},
	} {
		dir := filepath.Join(t.TempDir(), "m")
		args := append(append([]string{"new", "-tidy=false"}, tc.args...), "example.com/whoami", dir)
		if code, _, errs := ephemera(t, tc.version, args...); code != 0 {
			t.Fatalf("%s: exit %d: %s", args, code, errs)
		}
		gomod := readFile(t, dir, "go.mod")
		for _, w := range tc.want {
			if !strings.Contains(gomod, w) {
				t.Errorf("version %s, %s: go.mod does not say %q:\n%s", tc.version, tc.args, w, gomod)
			}
		}
		if mk := readFile(t, dir, "Makefile"); slices.Contains(tc.args, "-replace") && !strings.Contains(mk, "go build -C $(EPHEMERA)/deploy/images -o $@ .") {
			t.Errorf("Makefile does not run the checkout's image builder:\n%s", mk)
		}
	}
}

func readFile(t *testing.T, dir, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func readYAML(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// dig returns m[k0][k1]..., nil when a step is missing.
func dig(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func toStrings(v any) []string {
	var out []string
	list, _ := v.([]any)
	for _, x := range list {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// unknownKeys lists the keys of got (maps only, recursively) that want has
// not; a map value of want that is empty or null takes anything.
func unknownKeys(got, want map[string]any, prefix string) []string {
	var out []string
	for k, v := range got {
		wv, ok := want[k]
		if !ok {
			out = append(out, prefix+k)
			continue
		}
		gm, gok := v.(map[string]any)
		wm, wok := wv.(map[string]any)
		if gok && wok && len(wm) > 0 {
			out = append(out, unknownKeys(gm, wm, prefix+k+".")...)
		}
	}
	return out
}
