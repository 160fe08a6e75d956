package main

import (
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

// What a plugin's dir= may be. The driver bind-mounts into a pod the
// directories a plugin returns from Create, resolved beneath dir= by file
// descriptor: no "..", no symbolic link, but through the mount points below
// it. So dir= is the most of the host that a plugin can put into a pod, and it
// must be a directory of the plugin's own. It may not be, lie below, or
// contain (the three are "overlap" below):
//
//   - a filesystem root ("/"): every host path;
//   - a kernel interface (systemDirs): /proc, /sys (with the cgroup, bpf,
//     debugfs, tracefs, securityfs, pstore, configfs and efivarfs mounts below
//     it), /dev (devtmpfs, with devpts, shm, mqueue and hugetlbfs below it);
//   - what hands out the node (systemDirs): the kubelet's credentials
//     (/etc/kubernetes), the container runtimes' sockets and data (containerd,
//     CRI-O, Docker), the pods' logs;
//   - the driver's own paths (hostPaths, after parsing): --kubelet-root (every
//     pod's volumes; a directory below it is as bad as above), --state-dir
//     (the state and the dir and loop volumes), the CSI socket (--endpoint),
//     every plugin's socket (its own too: a pod given it could call the
//     plugin as the driver does) and every other plugin's dir=;
//   - on Linux, a pseudo filesystem (pseudoFSTypes) of the driver's mount
//     table: one that holds dir=, or is mounted below it (a /host/proc).
//
// The list of systemDirs is what no driver configuration needs, not every
// sensitive path of a host: /run, /var and /etc are refused as parents of
// entries, while /run/ephemera/NAME or /var/lib/ephemera/plugins/NAME are
// accepted. Paths are compared cleaned, component by component (/var/lib/kubelet2
// is not below /var/lib/kubelet), as given and again with the symbolic links of
// their existing part resolved, at start; on Windows without regard to case.

// hostDir is a path no plugin's dir= may overlap, and what it is.
type hostDir struct {
	path string
	what string // "--kubelet-root=/var/lib/kubelet (every pod's volumes)"
}

// systemDirs are the host paths no plugin's dir= may overlap, whatever the
// flags. None on Windows, where a plugin's dir= is refused only as a
// volume's root and against the driver's own paths.
var systemDirs = func() []hostDir {
	if runtime.GOOS == "windows" {
		return nil
	}
	dirs := []hostDir{
		{"/proc", "/proc (the kernel's proc filesystem)"},
		{"/sys", "/sys (sysfs, with cgroup, bpf, debugfs, tracefs and securityfs below it)"},
		{"/dev", "/dev (the node's devices, with devpts, shm and mqueue below it)"},
		{"/etc/kubernetes", "/etc/kubernetes (the kubelet's credentials)"},
		{"/var/lib/containerd", "/var/lib/containerd (every container's files)"},
		{"/var/lib/containers", "/var/lib/containers (every container's files)"},
		{"/var/lib/docker", "/var/lib/docker (every container's files)"},
		{"/var/log/pods", "/var/log/pods (every pod's logs)"},
	}
	for _, run := range []string{"/run", "/var/run"} {
		for _, s := range []string{"containerd", "crio", "docker.sock"} {
			p := run + "/" + s
			dirs = append(dirs, hostDir{p, p + " (a container runtime's socket)"})
		}
	}
	return dirs
}()

// pseudoFSTypes are the filesystem types of the kernel's interfaces: a plugin's
// dir= may not lie in one or contain one, wherever it is mounted.
var pseudoFSTypes = []string{
	"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
	"bpf", "configfs", "pstore", "efivarfs", "fusectl", "binfmt_misc", "mqueue", "selinuxfs", "nsfs",
}

// hostPaths are the driver's paths a plugin's dir= may not overlap, known
// once every flag is parsed.
type hostPaths struct {
	kubeletRoot string // --kubelet-root
	stateDir    string // --state-dir, or its default
	endpoint    string // --endpoint; empty: its default, below the kubelet root
	// mounts is the driver's mount table (Linux); nil: not checked.
	mounts []mount.MountInfo
}

// suggestDir is what a refusal of name's dir= suggests instead.
func suggestDir(name string) string {
	if runtime.GOOS == "windows" {
		return `C:\var\lib\ephemera\plugins\` + name
	}
	return "/var/lib/ephemera/plugins/" + name
}

// checkDirLexically refuses a dir= that is a filesystem root or overlaps one
// of systemDirs, as given: what Set can check without the other flags.
func (s pluginSpec) checkDirLexically() error {
	if filepath.Dir(s.dir) == s.dir {
		return fmt.Errorf("dir=%s is the root of the host's filesystem: the plugin could have the driver bind-mount any host path into a pod; give the plugin a directory of its own, e.g. dir=%s", s.dir, suggestDir(s.name))
	}
	for _, h := range systemDirs {
		if rel := relation(s.dir, h.path); rel != "" {
			return s.refuse(s.dir, rel, h.what)
		}
	}
	return nil
}

// refuse is the error for a dir= that stands in relation rel ("is", "lies
// below", "contains") to the host path described by what; shown is dir= as
// compared, resolved when that differs from dir= as given.
func (s pluginSpec) refuse(shown, rel, what string) error {
	d := "dir=" + s.dir
	if shown != s.dir {
		d += " (" + shown + " once its symbolic links are resolved)"
	}
	return fmt.Errorf("%s %s %s: the plugin could have the driver bind-mount what is there into a pod; give the plugin a directory of its own, e.g. dir=%s", d, rel, what, suggestDir(s.name))
}

// checkDirs refuses a plugin whose dir= overlaps a host path of systemDirs,
// the driver's paths in h, a plugin's socket or another plugin's dir=, as
// given and with symbolic links resolved, or holds or contains a pseudo
// filesystem of h.mounts. The error names the --plugin value.
func (p pluginFlags) checkDirs(h hostPaths) error {
	for _, s := range p {
		if s.dir == "" {
			continue
		}
		if err := p.checkDir(s, h); err != nil {
			return fmt.Errorf("--plugin %s: %w", s, err)
		}
	}
	return nil
}

// checkDir is checkDirs for one plugin s of p.
func (p pluginFlags) checkDir(s pluginSpec, h hostPaths) error {
	if err := s.checkDirLexically(); err != nil {
		return err
	}
	dirs := slices.Clone(systemDirs)
	add := func(path, what string) {
		if path != "" && filepath.IsAbs(path) {
			dirs = append(dirs, hostDir{filepath.Clean(path), what})
		}
	}
	add(h.kubeletRoot, "--kubelet-root="+h.kubeletRoot+" (every pod's volumes)")
	add(h.stateDir, "--state-dir="+h.stateDir+" (the driver's state and its dir and loop volumes)")
	if sock, ok := unixSocket(h.endpoint); ok {
		add(sock, "--endpoint="+h.endpoint+" (the driver's CSI socket)")
	}
	for _, o := range p {
		sock, _ := unixSocket(o.endpoint)
		add(sock, "the socket of plugin "+o.name+" ("+o.endpoint+")")
		if o.name != s.name {
			add(o.dir, "the dir= of plugin "+o.name+" ("+o.dir+")")
		}
	}
	res := resolved(s.dir)
	if filepath.Dir(res) == res {
		return s.refuse(res, "is", "the root of the host's filesystem")
	}
	for _, d := range dirs {
		if rel := relation(s.dir, d.path); rel != "" {
			return s.refuse(s.dir, rel, d.what)
		}
		if resD := resolved(d.path); resD != d.path || res != s.dir {
			if rel := relation(res, resD); rel != "" {
				what := d.what
				if resD != d.path {
					what += ", " + resD + " once its symbolic links are resolved"
				}
				return s.refuse(res, rel, what)
			}
		}
	}
	for _, m := range h.mounts {
		if !slices.Contains(pseudoFSTypes, m.FSType) {
			continue
		}
		if rel := relation(res, m.MountPoint); rel != "" {
			return s.refuse(res, rel, m.MountPoint+", where a "+m.FSType+" filesystem is mounted (a kernel interface)")
		}
	}
	return nil
}

// relation says how path a stands to path b, both absolute: "is", "lies
// below", "contains", or "" when neither holds the other. It compares
// cleaned paths component by component (filepath.Rel, which on Windows
// ignores case), never as strings: /var/lib/kubelet2 is not below
// /var/lib/kubelet.
func relation(a, b string) string {
	switch {
	case !filepath.IsAbs(a) || !filepath.IsAbs(b):
		return ""
	case below(a, b):
		if below(b, a) {
			return "is"
		}
		return "lies below"
	case below(b, a):
		return "contains"
	}
	return ""
}

// below reports whether a is b or lies below it.
func below(a, b string) bool {
	rel, err := filepath.Rel(b, a)
	return err == nil && !filepath.IsAbs(rel) && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// resolved returns p with the symbolic links of its longest existing prefix
// resolved (filepath.EvalSymlinks) and the rest appended as given; p, cleaned,
// when no prefix resolves.
func resolved(p string) string {
	rest := ""
	for q := filepath.Clean(p); ; {
		if r, err := filepath.EvalSymlinks(q); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(q)
		if parent == q {
			return filepath.Clean(p)
		}
		rest = filepath.Join(filepath.Base(q), rest)
		q = parent
	}
}

// unixSocket returns the path of a unix:// (or unix:) endpoint.
func unixSocket(endpoint string) (string, bool) {
	p, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		p, ok = strings.CutPrefix(endpoint, "unix:")
	}
	return p, ok && filepath.IsAbs(p)
}
