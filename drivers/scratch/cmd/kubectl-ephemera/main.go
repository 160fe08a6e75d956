package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/scratch/internal/buildinfo"
	"github.com/ephemera-csi/ephemera/drivers/scratch/internal/volumetable"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// help is what "kubectl ephemera help" (and -h, --help, no command) prints.
const help = `kubectl ephemera: what the Ephemera scratch driver holds on a cluster's nodes.

Commands:
  volumes   List the volumes each node's driver holds (kubectl ephemera volumes -h)
  version   Print this plugin's version, commit and Go version
  help      Print this help

`

// usage is the volumes command's.
const usage = `usage: kubectl ephemera volumes [flags]

Lists the volumes the Ephemera scratch driver holds, per node, through the API
server's pod proxy to each driver pod's GET /volumes, --concurrency at once
(RBAC: list pods and get pods/proxy in the driver's namespace).

`

// nodeVolumes is one driver pod's answer, as -o json prints it.
type nodeVolumes struct {
	Node    string          `json:"node"`
	Pod     string          `json:"pod"`
	Error   string          `json:"error,omitempty"`
	Volumes *api.VolumeList `json:"volumes,omitempty"`
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, help)
		return 2
	}
	switch args[0] {
	case "volumes":
	case "version", "--version", "-version":
		buildinfo.Read(version, commit).Print(stdout, "kubectl-ephemera")
		return 0
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, help)
		return 0
	default:
		fmt.Fprintf(stderr, "unknown command %q\n\n%s", args[0], help)
		return 2
	}
	fs := flag.NewFlagSet("kubectl ephemera volumes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	kubeconfig := fs.String("kubeconfig", "", "Kubeconfig file. Default: $KUBECONFIG, then ~/.kube/config.")
	kubeContext := fs.String("context", "", "Kubeconfig context. Default: the current one.")
	namespace := fs.String("namespace", "kube-system", "The driver's namespace.")
	selector := fs.String("selector", "app.kubernetes.io/name=ephemera-scratch", "Label selector of the driver's pods.")
	port := fs.Int("port", 9809, "The driver's metrics port (--metrics-address).")
	node := fs.String("node", "", "Only this node. Default: every node with a driver pod.")
	output := fs.String("o", "table", "Output: table (short volume IDs), wide (whole IDs, pod UIDs, targets) or json.")
	timeout := fs.Duration("timeout", 30*time.Second, "Timeout of the whole command.")
	podTimeout := fs.Duration("pod-timeout", 10*time.Second, "Timeout of one driver pod's answer (a node that does not answer is reported, the others are listed).")
	concurrency := fs.Int("concurrency", 32, "Driver pods asked at once (through the API server's pod proxy).")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *concurrency < 1 || *podTimeout <= 0 {
		fmt.Fprintf(stderr, "--concurrency %d, --pod-timeout %s: want at least 1 and more than 0\n", *concurrency, *podTimeout)
		return 2
	}
	if *output != "table" && *output != "wide" && *output != "json" {
		fmt.Fprintf(stderr, "-o %q: want table, wide or json\n", *output)
		return 2
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: *kubeContext}).ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		// client-go's own text names KUBERNETES_MASTER, which kubectl no longer reads.
		fmt.Fprintf(stderr, "no kubeconfig: none at --kubeconfig, $KUBECONFIG or %s; point one of them at the cluster's (kubectl config view shows what kubectl uses)\n", clientcmd.RecommendedHomeFile)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "kubeconfig: %v\n", err)
		return 1
	}
	c, err := newClient(cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	pods, err := c.driverPods(ctx, *namespace, *selector, *node)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if len(pods) == 0 {
		where := "any node"
		if *node != "" {
			where = "node " + *node
		}
		fmt.Fprintf(stderr, "no running driver pod (%s in %s) on %s\n", *selector, *namespace, where)
		return 1
	}
	all := c.fanOut(ctx, pods, *namespace, *port, *concurrency, *podTimeout)
	var (
		rows   []volumetable.Row
		failed bool
	)
	for _, nv := range all {
		if nv.Error != "" {
			failed = true
			fmt.Fprintf(stderr, "node %s: %s\n", nv.Node, nv.Error)
		} else {
			rows = append(rows, volumetable.Rows(nv.Node, nv.Volumes)...)
		}
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(all); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	} else if err := volumetable.Print(stdout, rows, true, *output == "wide", time.Now()); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if failed {
		return 1
	}
	return 0
}

// client makes authenticated GETs to the API server.
type client struct {
	http *http.Client
	base *url.URL
}

func newClient(cfg *rest.Config) (*client, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server URL: %w", err)
	}
	return &client{http: hc, base: base}, nil
}

// get GETs the API path with query and decodes the JSON answer into out.
func (c *client) get(ctx context.Context, query url.Values, out any, path ...string) error {
	u := c.base.JoinPath(path...)
	u.RawQuery = query.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var st struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
		}
		se := &statusError{code: resp.StatusCode, msg: string(body)}
		if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
			se.apiServer = true
			if st.Message != "" {
				se.msg = st.Message
			}
		}
		return se
	}
	if err := json.Unmarshal(body, out); err != nil {
		if ctx.Err() != nil {
			// An answer cut short by the timeout: say so, not what the
			// cut left unparsable.
			return ctx.Err()
		}
		return fmt.Errorf("reading the answer: %w", err)
	}
	return nil
}

type statusError struct {
	code int
	msg  string
	// apiServer: the answer is a Kubernetes Status, the API server's (else
	// it came from the driver pod through the proxy).
	apiServer bool
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.code, http.StatusText(e.code), e.msg)
}

// pod is a driver pod.
type pod struct{ name, node string }

// driverPods lists the running driver pods, on node when given.
func (c *client) driverPods(ctx context.Context, ns, selector, node string) ([]pod, error) {
	q := url.Values{"labelSelector": {selector}}
	if node != "" {
		q.Set("fieldSelector", "spec.nodeName="+node)
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				NodeName string `json:"nodeName"`
			} `json:"spec"`
			Status struct {
				Phase string `json:"phase"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := c.get(ctx, q, &list, "api", "v1", "namespaces", ns, "pods"); err != nil {
		return nil, fmt.Errorf("listing the driver's pods in %s: %w (RBAC: list pods)", ns, err)
	}
	var pods []pod
	for _, p := range list.Items {
		if p.Status.Phase == "Running" {
			pods = append(pods, pod{name: p.Metadata.Name, node: p.Spec.NodeName})
		}
	}
	return pods, nil
}

// fanOut asks every pod for its volumes, at most concurrency at once, each
// within podTimeout (and ctx), and returns the answers in the order of pods.
// One node that hangs holds one slot until podTimeout, not the whole command.
func (c *client) fanOut(ctx context.Context, pods []pod, ns string, port, concurrency int, podTimeout time.Duration) []nodeVolumes {
	out := make([]nodeVolumes, len(pods))
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for i, p := range pods {
		out[i] = nodeVolumes{Node: p.node, Pod: p.name}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			out[i].Error = fmt.Sprintf("pod %s: not asked: %v", p.name, ctx.Err())
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			pctx, cancel := context.WithTimeout(ctx, podTimeout)
			defer cancel()
			list, err := c.volumes(pctx, ns, p.name, port)
			if err != nil {
				out[i].Error = err.Error()
				return
			}
			out[i].Volumes = list
		}()
	}
	wg.Wait()
	return out
}

// volumes asks the driver pod for GET /volumes through the pod proxy.
func (c *client) volumes(ctx context.Context, ns, name string, port int) (*api.VolumeList, error) {
	list := new(api.VolumeList)
	err := c.get(ctx, nil, list, "api", "v1", "namespaces", ns, "pods", fmt.Sprintf("%s:%d", name, port), "proxy", "volumes")
	var se *statusError
	if errors.As(err, &se) && se.code == http.StatusForbidden {
		return nil, fmt.Errorf("pod %s: %w (RBAC: get on pods/proxy in %s)", name, err, ns)
	}
	if errors.As(err, &se) && se.code == http.StatusNotFound && !se.apiServer {
		return nil, fmt.Errorf("pod %s: %w (the driver does not serve /volumes: it runs with --volumes-endpoint=false, or is older than this plugin)", name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", name, err)
	}
	return list, nil
}
