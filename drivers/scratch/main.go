package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/loop"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/drivers/vhdx"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/events"
	"github.com/ephemera-csi/ephemera/framework/kube"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// DriverName is the scratch driver's default CSI name.
const DriverName = "scratch.csi.ephemera.dev"

var version = "dev" // set with -ldflags "-X main.version=..."

// Per-OS defaults: tmpfs and loop are Linux-only, vhdx Windows-only.
var defaults = func() (d struct{ backends, backend string }) {
	if runtime.GOOS == "windows" {
		d.backends, d.backend = "dir,vhdx", "dir"
		return d
	}
	d.backends, d.backend = "tmpfs,dir,loop", "tmpfs"
	return d
}()

func main() {
	klog.InitFlags(nil)
	if len(os.Args) > 1 && os.Args[1] == "version" {
		printVersion(os.Stdout, readBuildInfo())
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "volumes" {
		// ephemera-scratch volumes [--address A] [--state-dir D]: see volumes.go.
		os.Exit(volumesCommand(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "state" {
		// ephemera-scratch state check|dump [--state-dir D]: see state.go.
		// state rebuild takes the driver's own flags and runs below.
		if len(os.Args) < 3 || os.Args[2] != "rebuild" {
			os.Exit(stateCommand(os.Args[2:], os.Stdout, os.Stderr))
		}
		rebuild = true
		os.Args = append(os.Args[:1], os.Args[3:]...)
	}
	var c config
	c.bindFlags(flag.CommandLine)
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { c.backendsSet = c.backendsSet || f.Name == "backends" })
	if c.version {
		printVersion(os.Stdout, readBuildInfo())
		return
	}
	if err := setLogFormat(c.logFormat, os.Stderr); err != nil {
		klog.ErrorS(err, "Invalid flags")
		os.Exit(2)
	}

	if err := c.validate(); err != nil {
		klog.ErrorS(err, "Invalid flags")
		os.Exit(2)
	}
	if c.api.enabled() {
		client, err := kubeClient(c.opts.DriverName, c.api.kubeconfig)
		if err != nil {
			klog.ErrorS(err, "Cannot reach the API server")
			os.Exit(1)
		}
		if err := c.api.addComponents(&c.opts, client); err != nil {
			klog.ErrorS(err, "Invalid flags")
			os.Exit(2)
		}
	}
	if err := run(c); err != nil {
		klog.ErrorS(err, "Driver failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// config is the command line: the framework's options (framework.BindFlags)
// and the scratch driver's own flags, grouped by what they configure.
type config struct {
	opts          framework.Options
	backends      string // --backends
	backendsSet   bool   // --backends was given
	windowsMode   string // --windows-mode
	maxVolumeSize string // --max-volume-size
	capacity      string // --capacity
	tmpfs         tmpfsFlags
	dir           dirFlags
	loop          loopFlags
	vhdx          vhdxFlags
	api           apiFlags
	plugins       pluginFlags // --plugin, repeatable
	kubeletRoot   string      // --kubelet-root's default, for an empty --kubelet-root
	version       bool        // --version
	logFormat     string      // --log-format
}

// tmpfsFlags configure the tmpfs backend.
type tmpfsFlags struct {
	defaultSize string // --default-size
	maxInodes   int64  // --tmpfs-max-inodes
}

// dirFlags configure the dir backend.
type dirFlags struct {
	softSize bool // --dir-soft-size
}

// loopFlags configure the loop backend.
type loopFlags struct {
	fsType      string // --loop-fstype
	defaultSize string // --loop-default-size
	preallocate bool   // --loop-preallocate
}

// vhdxFlags configure the vhdx backend.
type vhdxFlags struct {
	defaultSize string // --vhdx-default-size
	dynamic     bool   // --vhdx-dynamic
}

// apiFlags configure the optional connection to the API server.
type apiFlags struct {
	events     bool   // --events
	gcConfirm  bool   // --gc-confirm-with-api
	kubeconfig string // --kubeconfig
	// startupTaint is --startup-taint: the key of the taint to remove from the
	// node once the kubelet has registered the driver ("": none).
	startupTaint string
	// fleetDaemonSet is --fleet-daemonset: [NAMESPACE/]NAME of the driver's
	// DaemonSet, whose size spreads the start-up work ("": not read).
	fleetDaemonSet string
}

// serviceAccountNamespace is where a pod's service account mount names its
// namespace (the in-cluster client's token sits beside it).
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// fleetDaemonSet splits --fleet-daemonset into the DaemonSet's namespace and
// name; without a namespace, the one nsFile names (the pod's own).
func fleetDaemonSet(flagValue, nsFile string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(flagValue, "/")
	if !ok {
		name = namespace
		b, err := os.ReadFile(nsFile)
		if err != nil {
			return "", "", fmt.Errorf("--fleet-daemonset=%s names no namespace, and the pod's own is unknown (give NAMESPACE/NAME): %w", flagValue, err)
		}
		namespace = strings.TrimSpace(string(b))
	}
	if namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("--fleet-daemonset=%s: want NAME or NAMESPACE/NAME of the driver's DaemonSet", flagValue)
	}
	return namespace, name, nil
}

// fleetSizeFile is the file of the state directory that remembers the
// DaemonSet's size from the last start (kube.FleetSizeOptions.Path).
const fleetSizeFile = "fleet-size"

// startupTaintEnv is --startup-taint's default: deploy/components/startup-taint
// sets it on the driver container by name, which kustomize can patch in any
// overlay (a flag would need the container's index).
const startupTaintEnv = "EPHEMERA_STARTUP_TAINT"

// enabled: some flag needs the API server.
func (f apiFlags) enabled() bool { return f.events || f.gcConfirm || f.startupTaint != "" }

// bindFlags registers every flag of the driver on fs, writing into c.
func (c *config) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.backends, "backends", defaults.backends, "Comma-separated backends pods may choose with the \"backend\" attribute (tmpfs, dir, loop on Linux; dir, vhdx on Windows).")
	fs.StringVar(&c.windowsMode, "windows-mode", string(framework.WindowsHostProcess), "Windows: how the driver reaches the host. hostprocess: a HostProcess container (csi-proxy v2 as a library; backends dir and vhdx). csi-proxy: an ordinary Windows container; every change on the host is a call to csi-proxy v1 over its named pipes, which the pod mounts; only the dir backend (the default --backends then), its volumes in <kubelet-root>\\plugins\\<driver-name>\\volumes, where csi-proxy accepts paths.")
	fs.StringVar(&c.vhdx.defaultSize, "vhdx-default-size", "", "Size of vhdx volumes without a \"size\" attribute. Empty: \"size\" is required.")
	fs.BoolVar(&c.vhdx.dynamic, "vhdx-dynamic", false, "Create dynamically expanding VHDX files instead of fixed-size ones (fast and thin, but the node disk may be overcommitted).")
	fs.StringVar(&c.loop.fsType, "loop-fstype", "ext4", "Filesystem of loop volumes without an fsType: ext4 or xfs.")
	fs.StringVar(&c.loop.defaultSize, "loop-default-size", "", "Size of loop volumes without a \"size\" attribute. Empty: \"size\" is required.")
	fs.BoolVar(&c.loop.preallocate, "loop-preallocate", false, "Allocate loop backing files in full at publish (a full node disk then fails the publish, not the pod's writes).")
	fs.StringVar(&c.tmpfs.defaultSize, "default-size", "", "Size of tmpfs volumes without a \"size\" attribute, e.g. 64Mi. Empty: \"size\" is required.")
	fs.Int64Var(&c.tmpfs.maxInodes, "tmpfs-max-inodes", tmpfs.DefaultMaxInodes, "Largest \"nr_inodes\" a pod may request for a tmpfs volume, and the most a volume without it gets (one inode per 4KiB of size, at least 1024). Each inode (an empty file, a directory) costs about 1KiB of kernel memory that \"size\" does not limit. At least 1: there is no unlimited.")
	fs.StringVar(&c.maxVolumeSize, "max-volume-size", "4Gi", "Largest \"size\" a pod may request (and a backend may make of it), e.g. 4Gi; \"none\" for no limit beyond --capacity.")
	fs.BoolVar(&c.dir.softSize, "dir-soft-size", false, "Accept \"size\" on dir volumes without enforcing it.")
	fs.StringVar(&c.capacity, "capacity", "", "Per-backend budget for the sizes of all volumes on this node, e.g. tmpfs=4Gi,loop=200Gi. Empty: no budget.")
	fs.BoolVar(&c.api.events, "events", false, "Post events on pods whose volume failed to provision or refresh, or was removed as an orphan. Uses the in-cluster service account, which needs create and patch on events.")
	fs.StringVar(&c.opts.DriverName, "driver-name", DriverName, "CSI driver name; must match the CSIDriver object.")
	framework.BindFlags(fs, &c.opts)
	c.kubeletRoot = c.opts.Node.KubeletRootDir
	fs.StringVar(&c.opts.Volumes.DefaultBackend, "backend", defaults.backend, "Backend for volumes without a \"backend\" attribute.")
	fs.StringVar(&c.api.kubeconfig, "kubeconfig", "", "Kubeconfig for --events and --gc-confirm-with-api when the driver does not run in a pod. Empty: the in-cluster service account.")
	fs.StringVar(&c.logFormat, "log-format", logFormatText, "Log format: text (klog's) or json (one JSON object per line: time, level, msg, the key/value pairs, v). --v sets the verbosity of both.")
	fs.BoolVar(&c.version, "version", false, "Print the version, git commit and Go version, and exit (also: ephemera-scratch version).")
	fs.Var(&c.plugins, "plugin", "An out-of-process plugin as a backend: NAME=unix:///path/plugin.sock[,dir=/shared/dir] (repeatable). Pods select it with \"backend: NAME\"; NAME may not be a built-in backend. A plugin without storage of its own gets a tmpfs sized like tmpfs volumes (--default-size, --tmpfs-max-inodes, --max-volume-size); dir= is the directory below which the plugin's directories are bind-mounted: one of its own, not /, nor in, above or below /proc, /sys, /dev, --kubelet-root, --state-dir, a socket or another plugin's dir= (refused at start).")
	fs.StringVar(&c.api.startupTaint, "startup-taint", os.Getenv(startupTaintEnv), "Key of a taint (e.g. ephemera.dev/scratch-not-ready) that node provisioning puts on new nodes (kubelet --register-with-taints, or an autoscaler's startup taints) so that no pod is scheduled there before the driver can serve it: the driver removes every taint with this key from its own node once the kubelet has registered it (the node's CSINode lists the driver), and no other. Needs get and patch on nodes and get on csinodes (deploy/: the startup-taint component, with its admission policy). Defaults to $EPHEMERA_STARTUP_TAINT; empty: none.")
	fs.StringVar(&c.api.fleetDaemonSet, "fleet-daemonset", "", "The driver's DaemonSet, NAME (in the pod's namespace) or NAMESPACE/NAME: with --events or --gc-confirm-with-api the driver reads its size (status.desiredNumberScheduled, one GET from the API server's cache; needs get on daemonsets.apps) at every start, remembered in the state directory (fleet-size) so that the next start needs no request for it before its first list (a first start reads it at a random point of its first 30s), and spreads the start-up work no caller waits for, the orphan GC's first pod list and the CSIDriver check, over a window that grows with it: 50 ms per node, at least 5s (10s for the check), at most 5m, so that a fleet-wide restart reaches the API server at about 20 drivers a second. Empty: the fixed windows.")
	fs.BoolVar(&c.api.gcConfirm, "gc-confirm-with-api", false, "Before removing an orphan, confirm with the API server (pod informer for this node; needs list and watch on pods) that its pod is gone.")
	// The Options fields the flags above set, besides BindFlags' own: the
	// driver's messages name the flags (TestOperatorWords).
	for field, flag := range scratchFlagNames {
		c.opts.SetFlagName(field, flag)
	}
}

// scratchFlagNames are the flags of this driver that set fields of
// framework.Options (some through addComponents and run).
var scratchFlagNames = map[string]string{
	"DriverName":               "--driver-name",
	"Backends":                 "--backends",
	"Volumes.DefaultBackend":   "--backend",
	"Volumes.WindowsMode":      "--windows-mode",
	"Limits.MaxVolumeSize":     "--max-volume-size",
	"Limits.Capacity":          "--capacity",
	"Observability.Events":     "--events",
	"Observability.CSIDrivers": "--events or --gc-confirm-with-api",
	"GC.Pods":                  "--gc-confirm-with-api",
}

// validate checks what needs the final values of several flags, once all
// are parsed, and keeps what it parses: the --capacity budgets, and each
// plugin's dir= against the driver's paths and mount table (checkDirs).
func (c *config) validate() error {
	var err error
	if c.opts.Limits.Capacity, err = parseCapacity(c.capacity); err != nil {
		return err
	}
	h, err := c.hostPaths()
	if err != nil {
		return err
	}
	// Checked here, before the backends below it are made (New checks it too).
	if !filepath.IsAbs(h.stateDir) {
		return fmt.Errorf("--state-dir %q must be an absolute path", h.stateDir)
	}
	return c.plugins.checkDirs(h)
}

// hostPaths are the driver's paths as run and New will have them, and, on
// Linux when a plugin has a dir=, its mount table.
func (c *config) hostPaths() (hostPaths, error) {
	h := hostPaths{kubeletRoot: c.opts.Node.KubeletRootDir, stateDir: c.opts.Node.StateDir, endpoint: c.opts.Node.Endpoint}
	if h.kubeletRoot == "" {
		h.kubeletRoot = c.kubeletRoot
	}
	if h.stateDir == "" {
		h.stateDir = framework.DefaultStateDir(c.opts.DriverName)
	}
	if runtime.GOOS != "linux" || !slices.ContainsFunc(c.plugins, func(s pluginSpec) bool { return s.dir != "" }) {
		return h, nil
	}
	var err error
	if h.mounts, err = mount.ReadMountInfo(); err != nil {
		return h, fmt.Errorf("--plugin ...,dir=: the mount table, to check that no dir= holds a kernel filesystem: %w", err)
	}
	return h, nil
}

// addComponents adds to opts what talks to the API server: the event
// recorder (--events) as its Events, the orphan GC's pod informer
// (--gc-confirm-with-api) as its Pods, both among its Runnables, so that the
// driver runs them while it serves; and, with either, the client that reads
// the CSIDriver object for the startup check (CSIDrivers).
func (f apiFlags) addComponents(opts *framework.Options, client apiClient) error {
	var fleetSize func(ctx context.Context) (int, error)
	if f.fleetDaemonSet != "" && (f.events || f.gcConfirm) {
		ns, name, err := fleetDaemonSet(f.fleetDaemonSet, client.namespaceFile)
		if err != nil {
			return err
		}
		stateDir := opts.Node.StateDir
		if stateDir == "" {
			stateDir = framework.DefaultStateDir(opts.DriverName)
		}
		mem, err := kube.NewFleetSize(kube.FleetSizeOptions{Path: filepath.Join(stateDir, fleetSizeFile),
			Get: func(ctx context.Context) (int, error) { return client.daemonSets.DaemonSetSize(ctx, ns, name) }})
		if err != nil {
			return err
		}
		fleetSize = mem.Size
		opts.Runnables = append(opts.Runnables, mem)
	}
	if f.events || f.gcConfirm {
		opts.Observability.CSIDrivers = client.csiDrivers
		opts.Observability.FleetSize = fleetSize
	}
	if f.events {
		rec, err := events.New(events.Options{Client: client.events, DriverName: opts.DriverName, NodeName: opts.Node.ID})
		if err != nil {
			return err
		}
		opts.Observability.Events = rec
		opts.Runnables = append(opts.Runnables, rec)
	}
	if f.gcConfirm {
		pods, err := kube.NewPods(kube.PodsOptions{Client: client.pods, NodeName: opts.Node.ID, Resync: 10 * time.Minute, SyncTimeout: time.Minute, FleetSize: fleetSize})
		if err != nil {
			return err
		}
		opts.GC.Pods = pods
		opts.Runnables = append(opts.Runnables, pods)
	}
	if f.startupTaint != "" {
		st, err := kube.NewStartupTaint(kube.StartupTaintOptions{Client: client.nodes, NodeName: opts.Node.ID, DriverName: opts.DriverName, Key: f.startupTaint})
		if err != nil {
			return fmt.Errorf("--startup-taint: %w", err)
		}
		opts.Runnables = append(opts.Runnables, st)
	}
	return nil
}

// run builds the backends and the driver, then serves until SIGINT or SIGTERM
// (or, for "state rebuild", rebuilds the state and returns).
func run(c config) (err error) {
	opts := c.opts
	opts.Node.Version = version
	if opts.Node.StateDir == "" {
		opts.Node.StateDir = framework.DefaultStateDir(opts.DriverName)
	}
	tmpfsSize, err := quantity("--default-size", c.tmpfs.defaultSize)
	if err != nil {
		return err
	}
	if c.maxVolumeSize == "none" {
		opts.Limits.MaxVolumeSize = framework.NoMaxVolumeSize
	} else if opts.Limits.MaxVolumeSize, err = quantity("--max-volume-size", c.maxVolumeSize); err != nil {
		return err
	}
	if opts.Volumes.WindowsMode, err = framework.ParseWindowsMode(c.windowsMode); err != nil {
		return fmt.Errorf("--windows-mode: %w", err)
	}
	backends, dirRoot := c.backends, filepath.Join(opts.Node.StateDir, "volumes")
	var dirHost dir.Host
	if opts.Volumes.WindowsMode == framework.WindowsCSIProxy {
		if !c.backendsSet {
			backends = "dir"
		}
		if err := csiProxyRefuses(backends, len(c.plugins)); err != nil {
			return err
		}
		m, err := mount.NewCSIProxy(mount.CSIProxyOptions{})
		if err != nil {
			return fmt.Errorf("--windows-mode=csi-proxy: %w", err)
		}
		defer m.Close()
		opts.Volumes.Mounter, dirHost = m, m
		dirRoot = csiProxyDirRoot(opts.Node.KubeletRootDir, opts.DriverName)
	}
	opts.Backends = map[string]framework.Backend{}
	for _, name := range strings.Split(backends, ",") {
		var b framework.Backend
		switch name = strings.TrimSpace(name); name {
		case "tmpfs":
			b, err = c.tmpfs.backend(tmpfsSize)
		case "dir":
			b, err = c.dir.backend(dirRoot, dirHost)
		case "loop":
			b, err = c.loop.backend(filepath.Join(opts.Node.StateDir, "loop"), max(opts.Limits.MaxVolumeSize, 0))
		case "vhdx":
			b, err = c.vhdx.backend(filepath.Join(opts.Node.StateDir, "vhdx"), max(opts.Limits.MaxVolumeSize, 0))
		case "":
			continue
		default:
			return fmt.Errorf("--backends: unknown backend %q (known: tmpfs, dir, loop, vhdx)", name)
		}
		if err != nil {
			return err
		}
		opts.Backends[name] = b
	}
	plugins, err := c.plugins.backends(func() (*tmpfs.Backend, error) { return c.tmpfs.backend(tmpfsSize) },
		opts.DriverName, opts.Node.ID, opts.Observability.Logger)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := closePlugins(plugins); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := addPlugins(opts.Backends, plugins); err != nil {
		return err
	}
	d, err := framework.New(opts)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if rebuild {
		return rebuildState(ctx, d, os.Stdout)
	}
	return d.Run(ctx)
}

// backend returns the tmpfs backend; defaultSize is --default-size, parsed.
func (f tmpfsFlags) backend(defaultSize int64) (*tmpfs.Backend, error) {
	if f.maxInodes < 1 {
		return nil, fmt.Errorf("--tmpfs-max-inodes=%d must be at least 1: tmpfs has no unlimited inodes here, each costs about 1KiB of kernel memory", f.maxInodes)
	}
	return tmpfs.New(tmpfs.Options{DefaultSize: defaultSize, MaxInodes: f.maxInodes, MaxInodesName: "--tmpfs-max-inodes"})
}

// backend returns the dir backend, its volumes under root, made by host
// (nil: the os package).
func (f dirFlags) backend(root string, host dir.Host) (framework.Backend, error) {
	return dir.New(dir.Options{Root: root, AllowSoftSize: f.softSize, Host: host})
}

// csiProxyDirRoot is where the dir backend keeps its volumes in the
// csi-proxy mode: below the kubelet root, the only place csi-proxy v1
// accepts paths (unless an operator adds a --working-dir to csi-proxy), in
// the driver's own plugin directory, which the kubelet never cleans.
func csiProxyDirRoot(kubeletRoot, driverName string) string {
	return filepath.Join(kubeletRoot, "plugins", driverName, "volumes")
}

// csiProxyRefuses returns why backends (--backends) and plugins (the number
// of --plugin flags) cannot run in the csi-proxy mode: csi-proxy v1 can
// create and link directories, but cannot create or attach a VHDX, and a
// plugin's storage needs mounts it cannot make.
func csiProxyRefuses(backends string, plugins int) error {
	for _, name := range strings.Split(backends, ",") {
		switch name = strings.TrimSpace(name); name {
		case "dir", "":
		case "vhdx":
			return errors.New("--backends: vhdx needs --windows-mode=hostprocess: csi-proxy v1 cannot create or attach a VHDX; with --windows-mode=csi-proxy use --backends=dir")
		default:
			return fmt.Errorf("--backends: %q is not available with --windows-mode=csi-proxy, which serves the dir backend only", name)
		}
	}
	if plugins > 0 {
		return errors.New("--plugin is not available with --windows-mode=csi-proxy, which serves the dir backend only")
	}
	return nil
}

// backend returns the loop backend, its backing files in path.
func (f loopFlags) backend(path string, maxSize int64) (framework.Backend, error) {
	size, err := quantity("--loop-default-size", f.defaultSize)
	if err != nil {
		return nil, err
	}
	return loop.New(loop.Options{
		Dir:           path,
		DefaultFSType: f.fsType,
		DefaultSize:   size,
		MaxSize:       maxSize,
		Preallocate:   f.preallocate,
	})
}

// backend returns the vhdx backend, its disk files in path.
func (f vhdxFlags) backend(path string, maxSize int64) (framework.Backend, error) {
	size, err := quantity("--vhdx-default-size", f.defaultSize)
	if err != nil {
		return nil, err
	}
	return vhdx.New(vhdx.Options{
		Dir:         path,
		DefaultSize: size,
		MaxSize:     maxSize,
		Dynamic:     f.dynamic,
	})
}

func quantity(flagName, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() <= 0 {
		return 0, fmt.Errorf("%s=%q is not a positive quantity like 64Mi", flagName, s)
	}
	return q.Value(), nil
}

// apiClient is what --events and --gc-confirm-with-api write and read, and
// what the startup check of the CSIDriver object reads.
type apiClient struct {
	events     events.Client
	pods       kube.PodsClient
	csiDrivers framework.CSIDriverGetter
	nodes      kube.NodesClient
	daemonSets interface {
		DaemonSetSize(ctx context.Context, namespace, name string) (int, error)
	}
	// namespaceFile names the pod's namespace (--fleet-daemonset=NAME).
	namespaceFile string
}

// kubeClient talks to the API server (for --events and --gc-confirm-with-api)
// with the kubeconfig, or else the in-cluster service account. It is
// kube.Client, not a clientset: that would link every API group of
// Kubernetes.
func kubeClient(driverName, kubeconfig string) (apiClient, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return apiClient{}, fmt.Errorf("--events/--gc-confirm-with-api/--startup-taint need --kubeconfig or the in-cluster service account: %w", err)
	}
	cfg.UserAgent = driverName + "/" + version
	c, err := kube.NewClient(cfg)
	if err != nil {
		return apiClient{}, err
	}
	return apiClient{events: c.Events(), pods: c.Pods(), csiDrivers: c, nodes: c, daemonSets: c, namespaceFile: serviceAccountNamespace}, nil
}

// parseCapacity parses "tmpfs=4Gi,loop=200Gi": each backend once.
func parseCapacity(s string) (map[string]int64, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]int64{}
	given := map[string]string{} // backend: its first budget, as given
	for _, kv := range strings.Split(s, ",") {
		name, q, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--capacity: %q is not backend=quantity", kv)
		}
		if first, twice := given[name]; twice {
			return nil, fmt.Errorf("--capacity=%s: backend %s is given twice (%s=%s and %s=%s); give each backend one budget", s, name, name, first, name, q)
		}
		given[name] = q
		n, err := quantity("--capacity "+name, q)
		if err != nil {
			return nil, err
		}
		m[name] = n
	}
	return m, nil
}
