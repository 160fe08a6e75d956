package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
)

// ProtocolVersion is the plugin protocol version this package speaks.
const ProtocolVersion = "v1alpha1"

// Defaults of Options.
const (
	DefaultTimeout = 30 * time.Second
	// DefaultMaxContentBytes bounds one Content answer as content.Cost counts
	// it: three answers of it fit framework.DefaultContentBytesInFlight.
	DefaultMaxContentBytes = 16 << 20
	// DefaultReconnectMaxDelay: the longest a plugin that is back waits
	// for the driver to notice.
	DefaultReconnectMaxDelay = 5 * time.Second
)

// handshakeTimeout bounds the handshake Implements makes when it has none.
const handshakeTimeout = 5 * time.Second

// The driver's own keys in a volume's State, never sent to the plugin nor
// taken from it.
const (
	// createsKey records, before anything is created (Plan, or Create for a
	// volume published before it existed), whether the volume's storage is
	// the plugin's: "true" once Create is about to ask the plugin for it
	// (CREATE), "false" for the driver's tmpfs (a content-only plugin, or a
	// Create that never reached the plugin). Create and Delete follow it, not
	// the handshake of the moment: a volume of the driver's is torn down
	// without the plugin, and one that may hold the plugin's storage only
	// through it.
	createsKey = "ephemera.dev/plugin-creates"
	// storageKey marks a volume whose storage the plugin created (its Create
	// answered), so that it is deleted through the plugin even if a later
	// version of the plugin no longer creates storage.
	storageKey = "ephemera.dev/plugin-storage"
)

// reserved reports whether k is one of the driver's own State keys.
func reserved(k string) bool { return k == createsKey || k == storageKey }

// withState returns a copy of state with k set to val: State maps may be
// shared with the volume's record and are never changed in place.
func withState(state map[string]string, k, val string) map[string]string {
	out := make(map[string]string, len(state)+1)
	maps.Copy(out, state)
	out[k] = val
	return out
}

// pluginStorage reports what v's State says of its storage: whether the
// plugin was asked to create it (or did), and whether that was recorded at
// all (not for a volume published by a driver before createsKey, nor for one
// whose record was rebuilt from the node).
func pluginStorage(v *api.Volume) (plugins, known bool) {
	if v.State[storageKey] != "" {
		return true, true
	}
	switch v.State[createsKey] {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// Options configure the driver's side of one plugin.
type Options struct {
	// Name is the plugin's name in this driver: the backend name in
	// framework.Options.Backends, which pods select with the "backend"
	// attribute. Required.
	Name string
	// Endpoint is the plugin's socket: "unix:///path/plugin.sock" or an
	// absolute path. Required.
	Endpoint string
	// Dir is the directory the driver shares with the plugin. A directory the
	// plugin returns from Create is resolved beneath it (no symlinks, no
	// ".."). Empty: the plugin may not return directories.
	Dir string
	// Tmpfs makes the tmpfs of a content-only plugin's volumes (and of a
	// Create that returns a tmpfs): its size and inode caps apply. Nil:
	// tmpfs.New(tmpfs.Options{}).
	Tmpfs *tmpfs.Backend
	// DriverName and NodeID are sent in the handshake.
	DriverName string
	NodeID     string
	// Timeout bounds a call whose context has no deadline, and every
	// Validate (which gets no context from the framework). Default
	// DefaultTimeout.
	Timeout time.Duration
	// MaxContentBytes bounds one Content answer, as content.Cost counts it:
	// its data, its paths and content.FileOverhead per file, so that many
	// small files cost what they take in memory. The driver reserves it from
	// framework.Options.Volumes.ContentBytesInFlight for each call, and New of the
	// framework refuses a bound beyond that budget. Default
	// DefaultMaxContentBytes.
	MaxContentBytes int
	// MaxContentFiles bounds the files of one Content answer. Default
	// content.DefaultMaxFiles. Every path is also bounded in length and depth
	// (content.DefaultMaxPathBytes, content.DefaultMaxDepth). An answer
	// beyond a bound is refused before it is decoded.
	MaxContentFiles int
	// ReconnectMaxDelay bounds the wait between two attempts to reconnect
	// to a plugin that went away; calls fail with Unavailable meanwhile.
	// gRPC's own bound (2 minutes) would keep a plugin that comes back after
	// a long outage (a CrashLoopBackOff) unused that long. Default
	// DefaultReconnectMaxDelay.
	ReconnectMaxDelay time.Duration
	// Logger defaults to klog's.
	Logger klog.Logger
}

// Backend is a plugin as a framework.Backend. It also has every optional
// interface the protocol carries (Validator, Lister, HealthChecker,
// ContentProvider, Authorizer) and is a framework.DynamicBackend: which of
// them the plugin really implements comes from its handshake, made on first
// use and again after each reconnect. For a content-only plugin (no CREATE)
// it is also a Finder and MountOnly, as the tmpfs backend is; for a plugin
// whose handshake it does not know yet, neither.
type Backend struct {
	opts   Options
	path   string
	conn   *grpc.ClientConn
	client pb.PluginClient
	tmpfs  *tmpfs.Backend
	log    klog.Logger

	dials atomic.Uint64 // connections made: a new one means a new handshake

	hsMu sync.Mutex // serializes handshakes
	mu   sync.Mutex
	hs   *session // the handshake of the current connection; nil: none valid
	last *session // the last handshake made, valid or not
}

// session is what one handshake said.
type session struct {
	gen     uint64 // b.dials when it was made
	name    string
	version string
	caps    map[pb.Capability]bool
}

func (s *session) has(c pb.Capability) bool { return s.caps[c] }

// capNames lists a session's capabilities for logs.
func (s *session) capNames() []string {
	var out []string
	for c := range s.caps {
		out = append(out, strings.TrimPrefix(c.String(), "CAPABILITY_"))
	}
	slices.Sort(out)
	return out
}

var (
	_ framework.DynamicBackend  = (*Backend)(nil)
	_ framework.Finder          = (*Backend)(nil)
	_ framework.MountOnly       = (*Backend)(nil)
	_ framework.Validator       = (*Backend)(nil)
	_ framework.Lister          = (*Backend)(nil)
	_ framework.HealthChecker   = (*Backend)(nil)
	_ framework.ContentProvider = (*Backend)(nil)
	_ framework.Authorizer      = (*Backend)(nil)
	_ framework.Planner         = (*Backend)(nil)
	_ framework.LongProvisioner = (*Backend)(nil)
)

// New returns the plugin at opts.Endpoint as a backend. Nothing is dialed
// before the first call; a plugin that is not running makes calls fail with
// Unavailable (the kubelet retries) until it is. Close releases the
// connection.
func New(opts Options) (*Backend, error) {
	if opts.Name == "" {
		return nil, errors.New("plugin: Options.Name is required")
	}
	p, err := unixsock.EndpointPath(opts.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", opts.Name, err)
	}
	if opts.Dir != "" && !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("plugin %s: Dir %q must be an absolute path", opts.Name, opts.Dir)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxContentBytes <= 0 {
		opts.MaxContentBytes = DefaultMaxContentBytes
	}
	if opts.ReconnectMaxDelay <= 0 {
		opts.ReconnectMaxDelay = DefaultReconnectMaxDelay
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	b := &Backend{opts: opts, path: p, tmpfs: opts.Tmpfs, log: opts.Logger.WithValues(logkeys.Backend, opts.Name)}
	if b.tmpfs == nil {
		if b.tmpfs, err = tmpfs.New(tmpfs.Options{}); err != nil {
			return nil, err
		}
	}
	b.conn, err = unixsock.DialGRPC(p, func() { b.dials.Add(1) },
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxContentBytes+1<<20)),
		grpc.WithConnectParams(reconnect(opts.ReconnectMaxDelay)))
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", opts.Name, err)
	}
	b.client = pb.NewPluginClient(b.conn)
	return b, nil
}

// ContentLimits are the bounds of one Content answer (Options.MaxContentBytes
// and MaxContentFiles, the content package's bounds on paths): the codec
// checks an answer against them before decoding it, the driver reserves
// their MaxBytes of framework.Options.Volumes.ContentBytesInFlight for each call and
// writes the files under them (framework.ContentBounder).
func (b *Backend) ContentLimits() content.Limits {
	return content.Limits{MaxFiles: b.opts.MaxContentFiles, MaxBytes: int64(b.opts.MaxContentBytes)}.WithDefaults()
}

// reconnect is gRPC's default backoff (1 s growing 1.6 times per failed
// attempt, 20% jitter) bounded by maxDelay.
func reconnect(maxDelay time.Duration) grpc.ConnectParams {
	bc := backoff.DefaultConfig
	bc.BaseDelay = min(bc.BaseDelay, maxDelay)
	bc.MaxDelay = maxDelay
	return grpc.ConnectParams{Backoff: bc, MinConnectTimeout: 20 * time.Second}
}

// Close closes the connection to the plugin.
func (b *Backend) Close() error { return b.conn.Close() }

// Name returns the plugin's name in this driver.
func (b *Backend) Name() string { return b.opts.Name }

// session returns the current handshake, making one when there is none for
// the current connection.
func (b *Backend) session(ctx context.Context) (*session, error) {
	if s := b.current(); s != nil {
		return s, nil
	}
	b.hsMu.Lock()
	defer b.hsMu.Unlock()
	if s := b.current(); s != nil {
		return s, nil
	}
	resp, err := b.client.Handshake(ctx, &pb.HandshakeRequest{
		ProtocolVersions: []string{ProtocolVersion},
		DriverName:       b.opts.DriverName,
		PluginName:       b.opts.Name,
		NodeId:           b.opts.NodeID,
	})
	if err != nil {
		return nil, b.callError("Handshake", err)
	}
	if resp.GetProtocolVersion() != ProtocolVersion {
		return nil, fmt.Errorf("%w: plugin %s (%s %s) at %s answered the handshake with protocol version %q; this driver speaks %s",
			api.ErrUnavailable, b.opts.Name, clip(resp.GetName()), clip(resp.GetVersion()), b.path, clip(resp.GetProtocolVersion()), ProtocolVersion)
	}
	s := &session{gen: b.dials.Load(), name: resp.GetName(), version: resp.GetVersion(), caps: map[pb.Capability]bool{}}
	for _, c := range resp.GetCapabilities() {
		if _, known := pb.Capability_name[int32(c)]; known && c != pb.Capability_CAPABILITY_UNSPECIFIED {
			s.caps[c] = true
		}
	}
	b.mu.Lock()
	prev := b.last
	b.hs, b.last = s, s
	b.mu.Unlock()
	if prev == nil || prev.name != s.name || prev.version != s.version || !slices.Equal(prev.capNames(), s.capNames()) {
		b.log.Info("Plugin handshake", logkeys.Plugin, clip(s.name), logkeys.Version, clip(s.version), logkeys.Capabilities, s.capNames())
	}
	return s, nil
}

// current returns the handshake of the current connection, nil when the
// client has reconnected since (a restarted plugin) or none was made.
func (b *Backend) current() *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	// A connection that is not ready has lost its plugin (it may come back
	// as another version): the next call handshakes again, reconnecting.
	if b.hs != nil && b.hs.gen == b.dials.Load() && b.conn.GetState() == connectivity.Ready {
		return b.hs
	}
	return nil
}

// sessionOrLast is session, or when the plugin cannot be reached, what its
// last handshake said: decisions that need no call (a content-only plugin's
// volumes are the driver's tmpfs) survive a plugin that is down, so that the
// republish of a live volume keeps it and its last good content.
func (b *Backend) sessionOrLast(ctx context.Context) (*session, error) {
	s, err := b.session(ctx)
	if err == nil {
		return s, nil
	}
	b.mu.Lock()
	last := b.last
	b.mu.Unlock()
	if last != nil && errors.Is(err, api.ErrUnavailable) {
		return last, nil
	}
	return nil, err
}

// forget drops the handshake: the next call makes a new one.
func (b *Backend) forget() {
	b.mu.Lock()
	b.hs = nil
	b.mu.Unlock()
}

// withTimeout bounds ctx by Options.Timeout when it has no deadline.
func (b *Backend) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, b.opts.Timeout)
}

// Implements reports whether the plugin implements the optional interface
// iface now, from its handshake (made here when there is none). A plugin that
// cannot be reached is said to implement it: the call then fails with
// Unavailable.
func (b *Backend) Implements(iface any) bool {
	if _, ok := iface.(*framework.Planner); ok {
		return true // whatever the plugin says: Plan asks it
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(handshakeTimeout, b.opts.Timeout))
	defer cancel()
	s, err := b.sessionOrLast(ctx)
	if err != nil {
		switch iface.(type) {
		case *framework.Finder, *framework.MountOnly:
			// These let the framework skip its intent record: claimed only
			// when known to be true.
			return false
		case *framework.LongProvisioner:
			// Only what the plugin said lifts the publish's deadline.
			return false
		}
		return true
	}
	switch iface.(type) {
	case *framework.Finder, *framework.MountOnly:
		// A content-only plugin's volumes are the driver's tmpfs: nothing
		// but their mounts.
		return !s.has(pb.Capability_CAPABILITY_CREATE)
	case *framework.Validator:
		// Without VALIDATE or CREATE the volume is the driver's tmpfs, whose
		// attributes (mode, uid, gid, nr_inodes) and size rules apply.
		return s.has(pb.Capability_CAPABILITY_VALIDATE) || !s.has(pb.Capability_CAPABILITY_CREATE)
	case *framework.Lister:
		return s.has(pb.Capability_CAPABILITY_LIST)
	case *framework.HealthChecker:
		return s.has(pb.Capability_CAPABILITY_CHECK)
	case *framework.ContentProvider:
		return s.has(pb.Capability_CAPABILITY_CONTENT)
	case *framework.Authorizer:
		return s.has(pb.Capability_CAPABILITY_AUTHORIZE)
	case *framework.LongProvisioner:
		// Older plugins do not know the capability: their Create is bounded
		// by the publish, as it always was.
		return s.has(pb.Capability_CAPABILITY_LONG_PROVISIONING) && s.has(pb.Capability_CAPABILITY_CREATE)
	}
	return true
}

// start makes sure of a handshake and returns it with ctx bounded.
func (b *Backend) start(ctx context.Context) (context.Context, context.CancelFunc, *session, error) {
	ctx, cancel := b.withTimeout(ctx)
	s, err := b.session(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, cancel, s, nil
}

// Validate sends the volume's attributes to the plugin (VALIDATE) and takes
// the size it answers. A plugin without CREATE provides content only: its
// volumes are the driver's tmpfs, whose rules apply too (the tmpfs attributes
// when the plugin does not validate, the size in any case).
func (b *Backend) Validate(v *api.Volume) error {
	ctx, cancel := b.withTimeout(context.Background())
	defer cancel()
	s, err := b.sessionOrLast(ctx)
	if err != nil {
		return err
	}
	if !s.has(pb.Capability_CAPABILITY_VALIDATE) {
		if s.has(pb.Capability_CAPABILITY_CREATE) {
			return v.Params.Only()
		}
		// The framework cannot apply the tmpfs attributes: whether they
		// are this backend's follows the handshake. They are applied here.
		if err := b.tmpfs.Attributes().Apply(v); err != nil {
			return err
		}
		return b.tmpfs.Validate(v)
	}
	resp, err := b.client.Validate(ctx, &pb.ValidateRequest{Volume: toProto(v)})
	if err != nil {
		return b.callError("Validate", err)
	}
	if n := resp.GetSizeBytes(); n < 0 {
		return b.garbage("Validate", "size_bytes %d is negative", n)
	} else if n > 0 {
		v.Size = n
	}
	if !s.has(pb.Capability_CAPABILITY_CREATE) {
		// The tmpfs needs a size: the plugin's, else the tmpfs default.
		tv := &api.Volume{Size: v.Size, FSType: v.FSType}
		if err := b.tmpfs.Validate(tv); err != nil {
			return err
		}
		v.Size = tv.Size
	}
	return nil
}

// Plan decides, before anything is created for a first publish, whether the
// volume's storage is the plugin's (CREATE) or the driver's tmpfs (a
// content-only plugin), from the plugin's handshake (its last one when it
// cannot be reached: nothing is asked of it then), and records it in v.State
// for Create and Delete to follow.
func (b *Backend) Plan(ctx context.Context, v *api.Volume) (framework.Plan, error) {
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	s, err := b.sessionOrLast(ctx)
	if err != nil {
		return framework.Plan{}, err
	}
	creates := s.has(pb.Capability_CAPABILITY_CREATE)
	v.State = withState(v.State, createsKey, strconv.FormatBool(creates))
	return framework.Plan{MountOnly: !creates}, nil
}

// Create asks the plugin for the volume's storage (CREATE), or returns the
// driver's tmpfs for a volume planned as one (a content-only plugin's), as
// v.State records; a volume without a plan (published by an older driver,
// or rebuilt from the node) is decided by the handshake now.
func (b *Backend) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	plugins, known := pluginStorage(v)
	if known && !plugins {
		return b.tmpfsCreate(ctx, v) // the driver's: nothing to ask the plugin
	}
	ctx, cancel, s, err := b.start(ctx)
	if err != nil {
		b.createdNothing(v)
		return api.Source{}, err
	}
	defer cancel()
	if !s.has(pb.Capability_CAPABILITY_CREATE) {
		if known {
			b.createdNothing(v)
			return api.Source{}, fmt.Errorf("%w: plugin %s (%s %s) no longer implements CREATE, and volume %s was to get its storage from it: it was replaced since; the kubelet retries",
				api.ErrUnavailable, b.opts.Name, clip(s.name), clip(s.version), v.ID)
		}
		v.State = withState(v.State, createsKey, "false")
		return b.tmpfsCreate(ctx, v)
	}
	if !known {
		v.State = withState(v.State, createsKey, "true")
	}
	resp, err := b.client.Create(ctx, &pb.CreateRequest{Volume: toProto(v), Secrets: v.Secrets, Tokens: tokensToProto(v.Tokens)})
	if err != nil {
		return api.Source{}, b.callError("Create", err)
	}
	src, err := b.source(v, resp.GetSource())
	if err != nil {
		return api.Source{}, err
	}
	state := map[string]string{}
	for k, val := range resp.GetState() {
		if reserved(k) {
			return api.Source{}, b.garbage("Create", "state key %q is reserved", k)
		}
		state[k] = val
	}
	state[createsKey], state[storageKey] = "true", "true"
	v.State = state
	return src, nil
}

// createdNothing records that a Create that did not reach the plugin left
// nothing of the plugin's, unless an earlier Create of the volume did.
func (b *Backend) createdNothing(v *api.Volume) {
	if v.State[storageKey] == "" {
		v.State = withState(v.State, createsKey, "false")
	}
}

// source checks what the plugin answered Create and turns it into what the
// framework mounts.
func (b *Backend) source(v *api.Volume, src *pb.Source) (api.Source, error) {
	switch k := src.GetKind().(type) {
	case *pb.Source_Directory:
		p := k.Directory.GetPath()
		if b.opts.Dir == "" {
			return api.Source{}, b.garbage("Create", "it returned a directory, but the driver shares no directory with it (--plugin %s=...,dir=PATH)", b.opts.Name)
		}
		if p == "" || !path.IsAbs("/"+p) || !filepath.IsLocal(filepath.FromSlash(p)) || strings.Contains(p, `\`) {
			return api.Source{}, b.garbage("Create", "directory %q is not a relative path beneath its directory", clip(p))
		}
		return api.Source{Path: filepath.Join(b.opts.Dir, filepath.FromSlash(p)), Root: b.opts.Dir}, nil
	case *pb.Source_Tmpfs:
		t := k.Tmpfs
		tv := &api.Volume{Size: v.Size, FSType: v.FSType, Params: api.Params{}}
		if t.GetMode() != 0 {
			tv.Params[api.ParamMode] = strconv.FormatUint(uint64(t.GetMode()), 8)
		}
		if t.Uid != nil {
			tv.Params[api.ParamUID] = strconv.FormatUint(uint64(t.GetUid()), 10)
		}
		if t.Gid != nil {
			tv.Params[api.ParamGID] = strconv.FormatUint(uint64(t.GetGid()), 10)
		}
		if err := framework.ValidateVolume(b.tmpfs, tv); err != nil {
			return api.Source{}, b.garbage("Create", "tmpfs %v: %v", t, err)
		}
		if v.Size == 0 {
			v.Size = tv.Size
		}
		return b.tmpfs.Create(context.Background(), tv)
	default:
		return api.Source{}, b.garbage("Create", "no source, or a kind of source this driver does not know (a newer protocol?)")
	}
}

// tmpfsCreate creates v as the driver's tmpfs: with the tmpfs attributes of
// v.Params and no other (a plugin that validates without CREATE accepts its
// own, which are not the tmpfs's to refuse).
func (b *Backend) tmpfsCreate(ctx context.Context, v *api.Volume) (api.Source, error) {
	tv := *v
	tv.Params, tv.Values = api.Params{}, maps.Clone(v.Values)
	for _, k := range b.tmpfs.Attributes().Keys() {
		if val, ok := v.Params[k]; ok {
			tv.Params[k] = val
		}
	}
	// Those Validate did not apply already: a volume read back from its
	// record after a restart has them in Params.
	if err := b.tmpfs.Attributes().Apply(&tv); err != nil {
		return api.Source{}, err
	}
	return b.tmpfs.Create(ctx, &tv)
}

// Delete asks the plugin to free a volume's storage (CREATE; also for a
// volume known only by its ID, as the reconcile and the GC may have it). A
// volume that v.State says is the driver's tmpfs (a content-only plugin's) has
// nothing to free, and is deleted without the plugin, which may be down.
func (b *Backend) Delete(ctx context.Context, v *api.Volume) error {
	plugins, known := pluginStorage(v)
	if known && !plugins {
		return nil // the driver's tmpfs: nothing outside the mount
	}
	ctx, cancel, s, err := b.start(ctx)
	if err != nil {
		return b.deleteBlocked(v, known, err)
	}
	defer cancel()
	if !s.has(pb.Capability_CAPABILITY_CREATE) {
		if v.State[storageKey] == "" {
			// A volume without a plan (an older driver's: then a content-only
			// plugin's), or one whose Create never answered: this version
			// of the plugin keeps no storage to delete.
			return nil
		}
		return fmt.Errorf("%w: plugin %s created the storage of volume %s but no longer implements CREATE (%s %s): it cannot be deleted until a version that does runs; the kubelet retries (docs/operations.md, \"Pod stuck in Terminating\")",
			api.ErrUnavailable, b.opts.Name, v.ID, clip(s.name), clip(s.version))
	}
	if _, err := b.client.Delete(ctx, &pb.DeleteRequest{Volume: toProto(v)}); err != nil {
		return b.deleteBlocked(v, known, b.callError("Delete", err))
	}
	return nil
}

// deleteBlocked is the error of a Delete the plugin did not take (err): for
// storage that is the plugin's, with the way out.
func (b *Backend) deleteBlocked(v *api.Volume, known bool, err error) error {
	if !errors.Is(err, api.ErrUnavailable) {
		return err
	}
	what := "created the storage of volume " + v.ID
	switch {
	case v.State[storageKey] == "" && known:
		what = "was asked to create the storage of volume " + v.ID + " (its Create did not answer)"
	case !known:
		what = "may hold storage of volume " + v.ID + " (its record does not say whose storage it is: published by an older driver, or rebuilt from the node)"
	}
	return fmt.Errorf("%w; plugin %s %s and only it can delete it: start plugin %s again (any version that implements CREATE); the kubelet's next retry finishes the teardown (docs/operations.md, \"Pod stuck in Terminating\")",
		err, b.opts.Name, what, b.opts.Name)
}

// Find returns where a content-only plugin's volume is published from: the
// driver's tmpfs (the framework asks only when Implements says Finder, that
// is for a plugin without CREATE).
func (b *Backend) Find(ctx context.Context, v *api.Volume) (api.Source, error) {
	return b.tmpfs.Find(ctx, v)
}

// MountOnly: a content-only plugin's volume is nothing but its tmpfs mount
// (Implements says so only for a plugin without CREATE). With Find, the
// framework writes no intent record at a first publish and no synced record.
func (b *Backend) MountOnly() {}

// LongProvisioning marks the plugin's Create as one that may outlive the
// publish (framework.LongProvisioner): Implements says whether it does, from
// the handshake (CAPABILITY_LONG_PROVISIONING with CREATE).
func (b *Backend) LongProvisioning() {}

// List returns the volumes the plugin holds storage for (LIST).
func (b *Backend) List(ctx context.Context) ([]string, error) {
	ctx, cancel, s, err := b.start(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if !s.has(pb.Capability_CAPABILITY_LIST) {
		return nil, nil
	}
	resp, err := b.client.List(ctx, &pb.ListRequest{})
	if err != nil {
		return nil, b.callError("List", err)
	}
	ids := resp.GetVolumeIds()
	for _, id := range ids {
		if !validID(id) {
			return nil, b.garbage("List", "%q is not a volume ID (csi-<64 hex digits>)", clip(id))
		}
	}
	return ids, nil
}

// Check asks the plugin whether a volume's storage is intact (CHECK).
func (b *Backend) Check(ctx context.Context, v *api.Volume) error {
	ctx, cancel, s, err := b.start(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if !s.has(pb.Capability_CAPABILITY_CHECK) {
		return nil
	}
	resp, err := b.client.Check(ctx, &pb.CheckRequest{Volume: toProto(v)})
	if err != nil {
		return b.callError("Check", err)
	}
	if resp.GetAbnormal() {
		return fmt.Errorf("plugin %s: %s", b.opts.Name, clip(resp.GetMessage()))
	}
	return nil
}

// Content asks the plugin for the volume's files (CONTENT).
func (b *Backend) Content(ctx context.Context, v *api.Volume) (map[string]api.File, error) {
	ctx, cancel, s, err := b.start(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if !s.has(pb.Capability_CAPABILITY_CONTENT) {
		return nil, fmt.Errorf("%w: plugin %s (%s %s) provides no content", api.ErrUnavailable, b.opts.Name, clip(s.name), clip(s.version))
	}
	codec := &contentCodec{limits: b.ContentLimits()}
	resp, err := b.client.Content(ctx, &pb.ContentRequest{Volume: toProto(v), Secrets: v.Secrets, Tokens: tokensToProto(v.Tokens)}, grpc.ForceCodecV2(codec))
	var beyond *boundError
	switch {
	case errors.As(codec.refused, &beyond):
		return nil, fmt.Errorf("plugin %s: its Content answer is beyond the driver's bounds: %s (plugin.Options MaxContentBytes, MaxContentFiles)", b.opts.Name, beyond.msg)
	case codec.refused != nil:
		return nil, b.garbage("Content", "%v", codec.refused)
	}
	if err != nil {
		return nil, b.callError("Content", err)
	}
	files := make(map[string]api.File, len(resp.GetFiles()))
	for _, f := range resp.GetFiles() {
		p := f.GetPath() // checked by the codec: clean, relative, bounded
		if _, dup := files[p]; dup {
			return nil, b.garbage("Content", "file %q appears twice", clip(p))
		}
		if f.GetMode()&^0o7777 != 0 {
			return nil, b.garbage("Content", "file %q has mode %#o, beyond the permission bits", clip(p), f.GetMode())
		}
		files[p] = api.File{Data: f.GetData(), Mode: api.FileModeOf(f.GetMode())}
	}
	return files, nil
}

// Authorize asks the plugin to approve a volume (AUTHORIZE).
func (b *Backend) Authorize(ctx context.Context, v *api.Volume) error {
	ctx, cancel, s, err := b.start(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if !s.has(pb.Capability_CAPABILITY_AUTHORIZE) {
		return nil
	}
	resp, err := b.client.Authorize(ctx, &pb.AuthorizeRequest{Volume: toProto(v)})
	if err != nil {
		return b.callError("Authorize", err)
	}
	if !resp.GetAllowed() {
		reason := clip(resp.GetReason())
		if reason == "" {
			reason = "no reason given"
		}
		return fmt.Errorf("%w: plugin %s: %s", api.ErrPermissionDenied, b.opts.Name, reason)
	}
	return nil
}

// callError turns a failed call into an error naming the plugin. An answer
// with a kind (a pluginserver's: errkind.WireStatus) wraps the kind's
// sentinel, so that the framework gives it the code it has in process; an
// answer without one (an older plugin, one in another language, a refusal of
// the protocol) wraps the api sentinel of its code. Codes that say the plugin
// changed (it is gone, or does not know the call) drop the handshake.
func (b *Backend) callError(method string, err error) error {
	st, _ := status.FromError(err)
	msg := clip(st.Message())
	if kind, ok := errkind.FromWire(st); ok {
		return &remoteError{msg: fmt.Sprintf("%s (plugin %s)", msg, b.opts.Name), kind: kind}
	}
	var kind error
	switch st.Code() {
	case codes.InvalidArgument:
		msg = strings.TrimPrefix(msg, api.ErrInvalidParams.Error()+": ")
		return fmt.Errorf("%w: %s (plugin %s)", api.ErrInvalidParams, msg, b.opts.Name)
	case codes.PermissionDenied:
		kind = api.ErrPermissionDenied
	case codes.NotFound:
		kind = api.ErrNotFound
	case codes.AlreadyExists:
		kind = api.ErrAlreadyExists
	case codes.ResourceExhausted:
		kind = api.ErrResourceExhausted
	case codes.Aborted:
		kind = api.ErrBusy
	case codes.Unavailable:
		b.forget()
		return fmt.Errorf("%w: plugin %s at %s: %s (is it running?)", api.ErrUnavailable, b.opts.Name, b.path, msg)
	case codes.DeadlineExceeded, codes.Canceled:
		return fmt.Errorf("%w: plugin %s: %s did not answer in time: %s", api.ErrUnavailable, b.opts.Name, method, msg)
	case codes.Unimplemented, codes.FailedPrecondition:
		b.forget()
		return fmt.Errorf("%w: plugin %s refused %s (%s: %s); it may have been replaced by a version that speaks another protocol",
			api.ErrUnavailable, b.opts.Name, method, st.Code(), msg)
	default:
		return fmt.Errorf("plugin %s: %s failed (%s): %s", b.opts.Name, method, st.Code(), msg)
	}
	return fmt.Errorf("%w: %s (plugin %s)", kind, msg, b.opts.Name)
}

// remoteError is a plugin's error of a known kind: the plugin's message, and
// the kind's sentinel (or the backend's own gRPC status) to match.
type remoteError struct {
	msg  string
	kind error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.kind }

// garbage is the error for an answer that breaks the protocol.
func (b *Backend) garbage(method, format string, args ...any) error {
	return fmt.Errorf("plugin %s broke protocol %s in its %s answer: %s", b.opts.Name, ProtocolVersion, method, fmt.Sprintf(format, args...))
}

// clip bounds a string from the plugin before it reaches a message or a log.
func clip(s string) string {
	const maxLen = 512
	if len(s) > maxLen {
		return s[:maxLen] + "…"
	}
	return s
}

// validID reports whether id has the shape of an inline volume handle.
func validID(id string) bool {
	h, ok := strings.CutPrefix(id, "csi-")
	if !ok || len(h) != 64 {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
