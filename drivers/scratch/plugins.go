package main

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/plugin"
)

// builtinBackends are the names --backends knows; a plugin may not take one,
// whatever --backends enables, so that "backend: tmpfs" always means the
// driver's own tmpfs.
var builtinBackends = []string{"tmpfs", "dir", "loop", "vhdx"}

// pluginSpec is one --plugin NAME=unix:///path.sock[,dir=/shared/dir][,max-content-bytes=16Mi][,max-content-files=N].
type pluginSpec struct {
	name     string
	endpoint string
	dir      string
	maxBytes int64 // 0: plugin.DefaultMaxContentBytes
	maxFiles int   // 0: content.DefaultMaxFiles
}

// pluginFlags is the repeatable --plugin flag. Set checks each value as it is
// parsed, so that a mistake is reported with the value that has it.
type pluginFlags []pluginSpec

func (p *pluginFlags) String() string {
	if p == nil {
		return ""
	}
	s := make([]string, len(*p))
	for i, x := range *p {
		s[i] = x.String()
	}
	return strings.Join(s, " ")
}

// String is the spec as --plugin takes it.
func (x pluginSpec) String() string {
	s := x.name + "=" + x.endpoint
	if x.dir != "" {
		s += ",dir=" + x.dir
	}
	if x.maxBytes != 0 {
		s += ",max-content-bytes=" + strconv.FormatInt(x.maxBytes, 10)
	}
	if x.maxFiles != 0 {
		s += ",max-content-files=" + strconv.Itoa(x.maxFiles)
	}
	return s
}

// Set parses NAME=unix:///path.sock[,dir=/shared/dir][,...], each option at
// most once. It refuses a dir= that is a filesystem root or overlaps one of
// systemDirs; the checks that need other flags' final values are checkDirs's,
// after parsing (config.validate).
func (p *pluginFlags) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" || rest == "" {
		return fmt.Errorf("%q is not NAME=unix:///path/plugin.sock[,dir=/shared/dir]", v)
	}
	if strings.ContainsAny(name, " ,/\\") {
		return fmt.Errorf("%q: the backend name %q may not contain spaces, commas or slashes (pods select it with \"backend: NAME\")", v, name)
	}
	for _, b := range builtinBackends {
		if name == b {
			return fmt.Errorf("%q: %q is a built-in backend of this driver (%s); give the plugin another name", v, name, strings.Join(builtinBackends, ", "))
		}
	}
	for _, x := range *p {
		if x.name == name {
			return fmt.Errorf("%q: a plugin named %q is already configured (%s); each --plugin needs a name of its own", v, name, x.endpoint)
		}
	}
	parts := strings.Split(rest, ",")
	s := pluginSpec{name: name, endpoint: parts[0]}
	sock, isURL := strings.CutPrefix(s.endpoint, "unix://")
	if !isURL || !filepath.IsAbs(sock) || filepath.Clean(sock) != sock {
		return fmt.Errorf("%q: endpoint %q must be unix:///absolute/path.sock, the socket the plugin listens on", v, s.endpoint)
	}
	given := map[string]string{} // option key: its first value
	for _, opt := range parts[1:] {
		k, val, _ := strings.Cut(opt, "=")
		if first, twice := given[k]; twice {
			return fmt.Errorf("%q: option %s= is given twice (%s=%s and %s=%s); give it once", v, k, k, first, k, val)
		}
		given[k] = val
		switch k {
		case "dir":
			if !filepath.IsAbs(val) || filepath.Clean(val) != val {
				return fmt.Errorf("%q: dir=%q must be a clean absolute path: the directory the plugin shares with the driver", v, val)
			}
			s.dir = val
		case "max-content-bytes":
			n, err := quantity("max-content-bytes", val)
			if err != nil || n <= 0 || n > math.MaxInt32 {
				return fmt.Errorf("%q: max-content-bytes=%q must be a positive quantity like 16Mi, below 2Gi: the most one Content answer may take, 512 bytes per file counted", v, val)
			}
			s.maxBytes = n
		case "max-content-files":
			n, err := strconv.Atoi(val)
			if err != nil || n <= 0 {
				return fmt.Errorf("%q: max-content-files=%q must be a positive number: the most files one Content answer may have", v, val)
			}
			s.maxFiles = n
		default:
			return fmt.Errorf("%q: unknown option %q (known: dir=/shared/dir, max-content-bytes=16Mi, max-content-files=10000)", v, opt)
		}
	}
	if s.dir != "" {
		if err := s.checkDirLexically(); err != nil {
			return fmt.Errorf("%q: %w", v, err)
		}
	}
	*p = append(*p, s)
	return nil
}

// backends returns a backend per plugin. Each gets a tmpfs backend of its
// own with the driver's tmpfs flags (--default-size, --tmpfs-max-inodes), so
// a content-only plugin's volumes are sized and capped as tmpfs volumes are.
func (p pluginFlags) backends(newTmpfs func() (*tmpfs.Backend, error), driverName, nodeID string, log klog.Logger) (map[string]*plugin.Backend, error) {
	out := make(map[string]*plugin.Backend, len(p))
	for _, s := range p {
		mem, err := newTmpfs()
		if err != nil {
			closePlugins(out)
			return nil, err
		}
		b, err := plugin.New(plugin.Options{
			Name:     s.name,
			Endpoint: s.endpoint,
			Dir:      s.dir,
			Tmpfs:    mem,

			MaxContentBytes: int(s.maxBytes),
			MaxContentFiles: s.maxFiles,
			DriverName:      driverName,
			NodeID:          nodeID,
			Logger:          log,
		})
		if err != nil {
			closePlugins(out)
			return nil, fmt.Errorf("--plugin %s: %w", s.name, err)
		}
		out[s.name] = b
	}
	return out, nil
}

// addPlugins adds the plugins to backends, refusing a name already taken.
func addPlugins(backends map[string]framework.Backend, plugins map[string]*plugin.Backend) error {
	for name, b := range plugins {
		if _, taken := backends[name]; taken {
			return fmt.Errorf("--plugin %s: backend %q exists already", name, name)
		}
		backends[name] = b
	}
	return nil
}

// closePlugins closes the plugins' connections.
func closePlugins(plugins map[string]*plugin.Backend) error {
	var errs []error
	for _, b := range plugins {
		if err := b.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close plugin %s: %w", b.Name(), err))
		}
	}
	return errors.Join(errs...)
}
