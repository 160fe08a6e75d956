// Command ephemera-scratch is a ready-to-run ephemeral inline CSI driver that gives
// every pod volume its own scratch space: a size-limited tmpfs (default) or a
// directory under the driver's state dir. On Windows the backends are dir
// (default) and vhdx (an NTFS volume of its own with a hard size); it then runs
// as a HostProcess container (deploy/overlays/windows-hostprocess).
//
//	volumes:
//	- name: scratch
//	  csi:
//	    driver: scratch.csi.ephemera.dev
//	    volumeAttributes: {size: 256Mi}        # backend: tmpfs | loop | dir
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
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
	if len(os.Args) > 1 && os.Args[1] == "state" {
		// ephemera-scratch state check|dump [--state-dir D]: see state.go.
		// state rebuild takes the driver's own flags and runs below.
		if len(os.Args) < 3 || os.Args[2] != "rebuild" {
			os.Exit(stateCommand(os.Args[2:], os.Stdout, os.Stderr))
		}
		rebuild = true
		os.Args = append(os.Args[:1], os.Args[3:]...)
	}
	var (
		opts         framework.Options
		backends     = flag.String("backends", defaults.backends, "Comma-separated backends pods may choose with the \"backend\" attribute (tmpfs, dir, loop on Linux; dir, vhdx on Windows).")
		vhdxSize     = flag.String("vhdx-default-size", "", "Size of vhdx volumes without a \"size\" attribute. Empty: \"size\" is required.")
		vhdxDynamic  = flag.Bool("vhdx-dynamic", false, "Create dynamically expanding VHDX files instead of fixed-size ones (fast and thin, but the node disk may be overcommitted).")
		loopFS       = flag.String("loop-fstype", "ext4", "Filesystem of loop volumes without an fsType: ext4 or xfs.")
		loopSize     = flag.String("loop-default-size", "", "Size of loop volumes without a \"size\" attribute. Empty: \"size\" is required.")
		loopPrealloc = flag.Bool("loop-preallocate", false, "Allocate loop backing files in full at publish (a full node disk then fails the publish, not the pod's writes).")
		defaultSize  = flag.String("default-size", "", "Size of tmpfs volumes without a \"size\" attribute, e.g. 64Mi. Empty: \"size\" is required.")
		maxInodes    = flag.Int64("tmpfs-max-inodes", tmpfs.DefaultMaxInodes, "Largest \"nr_inodes\" a pod may request for a tmpfs volume, and the most a volume without it gets (one inode per 4KiB of size, at least 1024). Each inode (an empty file, a directory) costs about 1KiB of kernel memory that \"size\" does not limit. At least 1: there is no unlimited.")
		maxSize      = flag.String("max-volume-size", "", "Largest \"size\" a pod may request, e.g. 4Gi. Empty: no limit.")
		softSize     = flag.Bool("dir-soft-size", false, "Accept \"size\" on dir volumes without enforcing it.")
		capacity     = flag.String("capacity", "", "Per-backend budget for the sizes of all volumes on this node, e.g. tmpfs=4Gi,loop=200Gi. Empty: no budget.")
		withEvents   = flag.Bool("events", false, "Post events on pods whose volume failed to provision or refresh, or was removed as an orphan. Uses the in-cluster service account, which needs create and patch on events.")
	)
	flag.StringVar(&opts.DriverName, "driver-name", DriverName, "CSI driver name; must match the CSIDriver object.")
	framework.BindFlags(flag.CommandLine, &opts)
	flag.StringVar(&opts.DefaultBackend, "backend", defaults.backend, "Backend for volumes without a \"backend\" attribute.")
	kubeconfig := flag.String("kubeconfig", "", "Kubeconfig for --events and --gc-confirm-with-api when the driver does not run in a pod. Empty: the in-cluster service account.")
	gcConfirm := flag.Bool("gc-confirm-with-api", false, "Before removing an orphan, confirm with the API server (pod informer for this node; needs get/list/watch on pods) that its pod is gone.")
	flag.Parse()

	var err error
	if opts.Capacity, err = parseCapacity(*capacity); err != nil {
		klog.ErrorS(err, "Invalid flags")
		os.Exit(2)
	}
	var starters []func(context.Context)
	if *withEvents || *gcConfirm {
		client, err := kubeClient(opts.DriverName, *kubeconfig)
		if err != nil {
			klog.ErrorS(err, "Cannot reach the API server")
			os.Exit(1)
		}
		if *withEvents {
			rec, err := events.New(events.Options{Client: client, DriverName: opts.DriverName, NodeName: opts.NodeID})
			if err != nil {
				klog.ErrorS(err, "Invalid flags")
				os.Exit(2)
			}
			opts.Events = rec
			opts.Runnables = append(opts.Runnables, rec)
		}
		if *gcConfirm {
			pods, err := kube.NewPods(kube.PodsOptions{Client: client, NodeName: opts.NodeID, Resync: 10 * time.Minute, SyncTimeout: time.Minute})
			if err != nil {
				klog.ErrorS(err, "Invalid flags")
				os.Exit(2)
			}
			opts.Pods = pods
			opts.Runnables = append(opts.Runnables, pods)
		}
	}
	bf := backendFlags{tmpfsMaxInodes: *maxInodes, loopFSType: *loopFS, loopSize: *loopSize, loopPreallocate: *loopPrealloc, vhdxSize: *vhdxSize, vhdxDynamic: *vhdxDynamic}
	err = run(opts, *backends, *defaultSize, *maxSize, *softSize, bf, starters)
	if err != nil {
		klog.ErrorS(err, "Driver failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// backendFlags are the flags of single backends.
type backendFlags struct {
	tmpfsMaxInodes int64
	// loop backend
	loopFSType, loopSize string
	loopPreallocate      bool
	// vhdx backend
	vhdxSize    string
	vhdxDynamic bool
}

func run(opts framework.Options, backends, defaultSize, maxSize string, softSize bool, bf backendFlags, starters []func(context.Context)) error {
	opts.Version = version
	if opts.StateDir == "" {
		opts.StateDir = framework.DefaultStateDir(opts.DriverName)
	}
	defSize, err := quantity("--default-size", defaultSize)
	if err != nil {
		return err
	}
	if opts.MaxVolumeSize, err = quantity("--max-volume-size", maxSize); err != nil {
		return err
	}
	opts.Backends = map[string]framework.Backend{}
	for _, name := range strings.Split(backends, ",") {
		switch name = strings.TrimSpace(name); name {
		case "tmpfs":
			if bf.tmpfsMaxInodes < 1 {
				return fmt.Errorf("--tmpfs-max-inodes=%d must be at least 1: tmpfs has no unlimited inodes here, each costs about 1KiB of kernel memory", bf.tmpfsMaxInodes)
			}
			b, err := tmpfs.New(tmpfs.Options{DefaultSize: defSize, MaxInodes: bf.tmpfsMaxInodes})
			if err != nil {
				return err
			}
			opts.Backends[name] = b
		case "dir":
			b, err := dir.New(dir.Options{Root: filepath.Join(opts.StateDir, "volumes"), AllowSoftSize: softSize})
			if err != nil {
				return err
			}
			opts.Backends[name] = b
		case "loop":
			size, err := quantity("--loop-default-size", bf.loopSize)
			if err != nil {
				return err
			}
			b, err := loop.New(loop.Options{
				Dir:           filepath.Join(opts.StateDir, "loop"),
				DefaultFSType: bf.loopFSType,
				DefaultSize:   size,
				MaxSize:       opts.MaxVolumeSize,
				Preallocate:   bf.loopPreallocate,
			})
			if err != nil {
				return err
			}
			opts.Backends[name] = b
		case "vhdx":
			size, err := quantity("--vhdx-default-size", bf.vhdxSize)
			if err != nil {
				return err
			}
			b, err := vhdx.New(vhdx.Options{
				Dir:         filepath.Join(opts.StateDir, "vhdx"),
				DefaultSize: size,
				MaxSize:     opts.MaxVolumeSize,
				Dynamic:     bf.vhdxDynamic,
			})
			if err != nil {
				return err
			}
			opts.Backends[name] = b
		case "":
		default:
			return fmt.Errorf("--backends: unknown backend %q (known: tmpfs, dir, loop, vhdx)", name)
		}
	}
	d, err := framework.New(opts)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for _, start := range starters {
		go start(ctx)
	}
	if rebuild {
		return rebuildState(ctx, d, os.Stdout)
	}
	return d.Run(ctx)
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

// kubeClient talks to the API server (for --events and --gc-confirm-with-api)
// with the kubeconfig, or else the in-cluster service account.
func kubeClient(driverName, kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("--events/--gc-confirm-with-api need --kubeconfig or the in-cluster service account: %w", err)
	}
	cfg.UserAgent = driverName + "/" + version
	return kubernetes.NewForConfig(cfg)
}

// parseCapacity parses "tmpfs=4Gi,loop=200Gi".
func parseCapacity(s string) (map[string]int64, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]int64{}
	for _, kv := range strings.Split(s, ",") {
		name, q, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--capacity: %q is not backend=quantity", kv)
		}
		n, err := quantity("--capacity "+name, q)
		if err != nil {
			return nil, err
		}
		m[name] = n
	}
	return m, nil
}
