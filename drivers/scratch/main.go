// Command ephemera-scratch is a ready-to-run ephemeral inline CSI driver that gives
// every pod volume its own scratch space: a size-limited tmpfs (default) or a
// directory under the driver's state dir.
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
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/loop"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
)

// DriverName is the scratch driver's default CSI name.
const DriverName = "scratch.csi.ephemera.dev"

var version = "dev" // set with -ldflags "-X main.version=..."

func main() {
	klog.InitFlags(nil)
	var (
		opts         framework.Options
		backends     = flag.String("backends", "tmpfs,dir,loop", "Comma-separated backends pods may choose with the \"backend\" attribute (tmpfs, dir, loop).")
		loopFS       = flag.String("loop-fstype", "ext4", "Filesystem of loop volumes without an fsType: ext4 or xfs.")
		loopSize     = flag.String("loop-default-size", "", "Size of loop volumes without a \"size\" attribute. Empty: \"size\" is required.")
		loopPrealloc = flag.Bool("loop-preallocate", false, "Allocate loop backing files in full at publish (a full node disk then fails the publish, not the pod's writes).")
		defaultSize  = flag.String("default-size", "", "Size of tmpfs volumes without a \"size\" attribute, e.g. 64Mi. Empty: \"size\" is required.")
		maxSize      = flag.String("max-volume-size", "", "Largest \"size\" a pod may request, e.g. 4Gi. Empty: no limit.")
		softSize     = flag.Bool("dir-soft-size", false, "Accept \"size\" on dir volumes without enforcing it.")
		capacity     = flag.String("capacity", "", "Per-backend budget for the sizes of all volumes on this node, e.g. tmpfs=4Gi,loop=200Gi. Empty: no budget.")
	)
	flag.StringVar(&opts.DriverName, "driver-name", DriverName, "CSI driver name; must match the CSIDriver object.")
	flag.StringVar(&opts.Endpoint, "endpoint", "", "CSI endpoint, unix:///path/csi.sock. Default unix://<kubelet-root>/plugins/<driver-name>/csi.sock.")
	flag.StringVar(&opts.NodeID, "nodeid", os.Getenv("NODE_NAME"), "Node ID (the Kubernetes node name). Default $NODE_NAME.")
	flag.StringVar(&opts.StateDir, "state-dir", "", "Directory for state.db and dir volumes. Default /var/lib/ephemera/<driver-name>.")
	flag.StringVar(&opts.KubeletRootDir, "kubelet-root", "/var/lib/kubelet", "The kubelet's --root-dir.")
	flag.StringVar(&opts.DefaultBackend, "backend", "tmpfs", "Backend for volumes without a \"backend\" attribute.")
	flag.Int64Var(&opts.MaxVolumesPerNode, "max-volumes-per-node", 0, "Volumes this driver serves per node, reported to the scheduler. 0: no limit.")
	flag.BoolVar(&opts.RegisterWithKubelet, "register", false, "Register with the kubelet through <kubelet-root>/plugins_registry (no node-driver-registrar sidecar needed).")
	flag.Parse()

	var err error
	if opts.Capacity, err = parseCapacity(*capacity); err != nil {
		klog.ErrorS(err, "Invalid flags")
		os.Exit(2)
	}
	lo := loopFlags{fsType: *loopFS, defaultSize: *loopSize, preallocate: *loopPrealloc}
	if err := run(opts, *backends, *defaultSize, *maxSize, *softSize, lo); err != nil {
		klog.ErrorS(err, "Driver failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

type loopFlags struct {
	fsType, defaultSize string
	preallocate         bool
}

func run(opts framework.Options, backends, defaultSize, maxSize string, softSize bool, lo loopFlags) error {
	opts.Version = version
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join("/var/lib/ephemera", opts.DriverName)
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
			opts.Backends[name] = tmpfs.New(tmpfs.Options{DefaultSize: defSize})
		case "dir":
			b, err := dir.New(dir.Options{Root: filepath.Join(opts.StateDir, "volumes"), AllowSoftSize: softSize})
			if err != nil {
				return err
			}
			opts.Backends[name] = b
		case "loop":
			size, err := quantity("--loop-default-size", lo.defaultSize)
			if err != nil {
				return err
			}
			b, err := loop.New(loop.Options{
				Dir:           filepath.Join(opts.StateDir, "loop"),
				DefaultFSType: lo.fsType,
				DefaultSize:   size,
				MaxSize:       opts.MaxVolumeSize,
				Preallocate:   lo.preallocate,
			})
			if err != nil {
				return err
			}
			opts.Backends[name] = b
		case "":
		default:
			return fmt.Errorf("--backends: unknown backend %q (known: tmpfs, dir, loop)", name)
		}
	}
	d, err := framework.New(opts)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
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
