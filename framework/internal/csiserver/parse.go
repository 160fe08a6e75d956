package csiserver

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// Publish is a read and checked NodePublishVolumeRequest.
type Publish struct {
	// Volume is the typed volume; its Backend is one the driver has.
	Volume *api.Volume
	// Params are all the pod's attributes, the framework's own included:
	// persisted and hashed.
	Params api.Params
	// Hash identifies what the pod asked for (RequestHash).
	Hash string
}

// Parser reads requests by the driver's options.
type Parser struct {
	DriverName     string
	KubeletRootDir string
	Windows        bool // target paths are Windows paths
	// Own are the framework's own attributes (backend, size): volume.FrameworkParams.
	Own api.Attributes
	// Declared are the driver's declared attributes (Options.Volumes.AcceptedAttributes).
	Declared api.Attributes
	// MaxVolumeSize is Limits.MaxVolumeSize; 0 is none.
	MaxVolumeSize int64
	// Validate checks v as the named backend's (the framework's
	// ValidateVolume); the Parser completes its refusal of unknown
	// attributes with every key the pod may set (allAccepted).
	Validate func(backend string, v *api.Volume) error
}

// Publish validates req against the ephemeral inline contract and returns
// the typed volume. It does no I/O. Every error is InvalidArgument and says
// what to fix; Validate's errors keep their kinds. The steps, in order: the
// CSI fields (capability), the pod (podOf), the target path (target), the
// pod's attributes (podAttributes), the framework's own (Own: backend and
// size), fsGroup (fsGroupOf), the credentials (credentialsOf), the driver's
// declared attributes, then the backend's (Validate).
func (p *Parser) Publish(req *csi.NodePublishVolumeRequest) (*Publish, error) {
	mnt, err := p.capability(req)
	if err != nil {
		return nil, err
	}
	vc := req.GetVolumeContext()
	pod, err := p.podOf(vc)
	if err != nil {
		return nil, err
	}
	t, err := p.target(req.GetVolumeId(), req.GetTargetPath(), pod.UID)
	if err != nil {
		return nil, err
	}
	params, err := podAttributes(vc)
	if err != nil {
		return nil, err
	}
	own, err := p.Own.Parse(params)
	if err != nil {
		return nil, err
	}
	backend, size := own.String(api.ParamBackend), own.Int(api.ParamSize)
	if err := p.checkMaxSize(size); err != nil {
		return nil, err
	}
	fsGroup, err := fsGroupOf(mnt)
	if err != nil {
		return nil, err
	}
	secrets, tokens, err := credentialsOf(req)
	if err != nil {
		return nil, err
	}
	backendParams := volume.BackendParams(params)
	// A refusal of the driver's attributes waits for the backend's check, so
	// that a typo is named with the required key it misses.
	var attrs api.Values
	var attrErr error
	if len(p.Declared) > 0 {
		attrs, attrErr = p.Declared.Parse(backendParams)
		backendParams = p.Declared.Split(backendParams)
	}
	v := &api.Volume{
		ID:         req.GetVolumeId(),
		Name:       t.VolumeName,
		TargetPath: req.GetTargetPath(),
		Pod:        pod,
		Backend:    backend,
		ReadOnly:   req.GetReadonly(),
		FSType:     mnt.GetFsType(),
		FSGroup:    fsGroup,
		Size:       size,
		Params:     backendParams,
		Values:     attrs,
		Secrets:    secrets,
		Tokens:     tokens,
	}
	// The hash covers what the pod asked for, not the defaults a backend fills in
	// below, so an operator changing a default does not turn the republish of a
	// running pod into AlreadyExists.
	hash := RequestHash(v, params)
	if err := p.allAccepted(p.Validate(backend, v)); err != nil || attrErr != nil {
		return nil, joinInvalid(err, attrErr) // api.ErrInvalidParams: InvalidArgument
	}
	if p.MaxVolumeSize > 0 && v.Size > p.MaxVolumeSize {
		return nil, errkind.Invalidf("invalid volume attributes: backend %q makes the volume %s (after its defaults and rounding), more than this driver's maximum volume size of %s; ask for less", backend, bytes(v.Size), bytes(p.MaxVolumeSize))
	}
	return &Publish{Volume: v, Params: params, Hash: hash}, nil
}

// Unpublish checks a NodeUnpublishVolumeRequest: a volume ID and a target
// path of the kubelet's whose pod and volume the handle names.
func (p *Parser) Unpublish(req *csi.NodeUnpublishVolumeRequest) error {
	if req.GetVolumeId() == "" {
		return errkind.Invalidf("volume_id is required")
	}
	if req.GetTargetPath() == "" {
		return errkind.Invalidf("target_path is required")
	}
	t, err := volume.ParseTarget(p.KubeletRootDir, req.GetTargetPath(), p.Windows)
	if err != nil {
		return errkind.Invalidf("%v", err)
	}
	if err := t.CheckHandle(req.GetVolumeId()); err != nil {
		return errkind.Invalidf("%v; nothing was touched", err)
	}
	return nil
}

// capability checks the request's CSI fields: an unstaged filesystem volume
// with a single-node access mode and no mount flags. It returns the mount
// capability.
func (p *Parser) capability(req *csi.NodePublishVolumeRequest) (*csi.VolumeCapability_MountVolume, error) {
	if req.GetVolumeId() == "" {
		return nil, errkind.Invalidf("volume_id is required")
	}
	if req.GetTargetPath() == "" {
		return nil, errkind.Invalidf("target_path is required")
	}
	if req.GetStagingTargetPath() != "" {
		return nil, errkind.Invalidf("staging_target_path is set, but %s serves only ephemeral inline volumes, which are never staged", p.DriverName)
	}
	capability := req.GetVolumeCapability()
	if capability == nil {
		return nil, errkind.Invalidf("volume_capability is required")
	}
	if capability.GetBlock() != nil {
		return nil, errkind.Invalidf("block access is not supported: %s provides filesystem volumes only", p.DriverName)
	}
	mnt := capability.GetMount()
	if mnt == nil {
		return nil, errkind.Invalidf("volume_capability must have access_type mount")
	}
	if len(mnt.GetMountFlags()) > 0 {
		return nil, errkind.Invalidf("mount_flags %v are not supported for inline volumes", mnt.GetMountFlags())
	}
	switch m := capability.GetAccessMode().GetMode(); m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
	default:
		return nil, errkind.Invalidf("access mode %s is not supported: inline volumes are single-node (the kubelet sends SINGLE_NODE_WRITER)", m)
	}
	return mnt, nil
}

// podOf is the pod the kubelet names in the volume context of an ephemeral
// inline volume (podInfoOnMount).
func (p *Parser) podOf(vc map[string]string) (api.Pod, error) {
	eph, hasEph := vc[api.KeyEphemeral]
	uid, hasUID := vc[api.KeyPodUID]
	if !hasEph || !hasUID {
		return api.Pod{}, errkind.Invalidf("volume_context lacks pod information: CSIDriver %s must set podInfoOnMount: true (and volumeLifecycleModes: [Ephemeral])", p.DriverName)
	}
	if eph != "true" {
		return api.Pod{}, errkind.Invalidf("%s=%q: %s serves only ephemeral inline volumes (pod.spec.volumes[].csi), not PersistentVolumes; keep volumeLifecycleModes: [Ephemeral] on the CSIDriver", api.KeyEphemeral, eph, p.DriverName)
	}
	pod := api.Pod{Namespace: vc[api.KeyPodNamespace], Name: vc[api.KeyPodName], UID: uid, ServiceAccount: vc[api.KeyServiceAccountName]}
	if pod.Name == "" || pod.Namespace == "" || uid == "" {
		return api.Pod{}, errkind.Invalidf("volume_context must carry non-empty %s, %s and %s (CSIDriver %s must set podInfoOnMount: true)", api.KeyPodName, api.KeyPodNamespace, api.KeyPodUID, p.DriverName)
	}
	return pod, nil
}

// target parses the target path and checks it against the pod's UID and the
// volume handle.
func (p *Parser) target(volumeID, targetPath, podUID string) (volume.Target, error) {
	t, err := volume.ParseTarget(p.KubeletRootDir, targetPath, p.Windows)
	if err != nil {
		return t, errkind.Invalidf("%v", err)
	}
	if t.PodUID != podUID {
		return t, errkind.Invalidf("target_path belongs to pod UID %s but %s is %s; refusing a request for another pod's volume", t.PodUID, api.KeyPodUID, podUID)
	}
	if err := t.CheckHandle(volumeID); err != nil {
		return t, errkind.Invalidf("%v", err)
	}
	return t, nil
}

// podAttributes are the volume attributes the pod set: the volume context
// without the kubelet's keys. A pod may not set a key of the reserved prefix.
func podAttributes(vc map[string]string) (api.Params, error) {
	params := api.Params{}
	for k, v := range vc {
		if !strings.HasPrefix(k, api.ReservedPrefix) {
			params[k] = v
			continue
		}
		switch k {
		case api.KeyPodName, api.KeyPodNamespace, api.KeyPodUID, api.KeyServiceAccountName,
			api.KeyEphemeral, api.KeyServiceAccountTokens:
		default:
			return nil, errkind.Invalidf("attribute %q uses the reserved prefix %s; remove it from volumeAttributes", k, api.ReservedPrefix)
		}
	}
	return params, nil
}

// OwnAttributes declares the framework's own attributes, as a driver declares
// its (volume.FrameworkParams are their keys): backend, one of backends,
// defaultBackend when unset; size, a quantity of bytes, 0 when unset (the
// backend's default).
func OwnAttributes(backends []string, defaultBackend string) api.Attributes {
	return api.Attributes{
		api.EnumAttr(api.ParamBackend, backends...).Default(defaultBackend),
		api.QuantityAttr(api.ParamSize, 1, 0),
	}
}

// allAccepted completes a backend's refusal of unknown attributes with every
// key the pod may set: the backend's, the driver's declared ones and the
// framework's. Other errors pass through.
func (p *Parser) allAccepted(err error) error {
	var ue *api.UnknownAttributesError
	if err == nil {
		return nil
	}
	if !errors.As(err, &ue) {
		return err
	}
	accepted := slices.Concat(ue.Accepted, p.Declared.Keys(), volume.FrameworkParams)
	slices.Sort(accepted)
	return &api.UnknownAttributesError{Unknown: ue.Unknown, Accepted: slices.Compact(accepted)}
}

// checkMaxSize refuses a size above MaxVolumeSize.
func (p *Parser) checkMaxSize(size int64) error {
	if max := p.MaxVolumeSize; max > 0 && size > max {
		return errkind.Invalidf("invalid volume attributes: attribute %q: %s is more than this driver's maximum volume size of %s; ask for at most %s", api.ParamSize, bytes(size), bytes(max), bytes(max))
	}
	return nil
}

// fsGroupOf is the pod's fsGroup, which the kubelet sends as the volume mount
// group when the CSIDriver's fsGroupPolicy is File.
func fsGroupOf(mnt *csi.VolumeCapability_MountVolume) (*int64, error) {
	g := mnt.GetVolumeMountGroup()
	if g == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(g, 10, 64)
	if err != nil || n < 0 {
		return nil, errkind.Invalidf("volume_mount_group %q is not a group ID", g)
	}
	return &n, nil
}

// credentialsOf are the request's secrets without the service account tokens,
// and the tokens parsed.
func credentialsOf(req *csi.NodePublishVolumeRequest) (api.Secrets, api.Tokens, error) {
	tokens, err := api.ParseTokens(req.GetSecrets(), req.GetVolumeContext())
	if err != nil {
		return nil, nil, errkind.Invalidf("%v", err)
	}
	secrets := api.Secrets(req.GetSecrets())
	if _, ok := secrets[api.KeyServiceAccountTokens]; ok {
		secrets = maps.Clone(secrets)
		delete(secrets, api.KeyServiceAccountTokens)
	}
	return secrets, tokens, nil
}

// RequestHash identifies what a pod asked for. A second publish of the same
// volume with another hash is AlreadyExists. Tokens and secrets are excluded:
// they change on every republish.
func RequestHash(v *api.Volume, params api.Params) string {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	kv := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		kv = append(kv, k, params[k])
	}
	b, _ := json.Marshal(struct {
		Backend  string
		Params   []string
		ReadOnly bool
		FSType   string
		FSGroup  *int64
		Size     int64
	}{v.Backend, kv, v.ReadOnly, v.FSType, v.FSGroup, v.Size})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// joinInvalid is the first of errs that is not nil, or, when both refuse
// attributes, one refusal with both messages.
func joinInvalid(backendErr, attrErr error) error {
	if backendErr == nil || attrErr == nil || !errors.Is(backendErr, api.ErrInvalidParams) {
		if backendErr != nil {
			return backendErr
		}
		return attrErr
	}
	prefix := api.ErrInvalidParams.Error() + ": "
	return api.InvalidParamf("%s; %s", strings.TrimPrefix(backendErr.Error(), prefix), strings.TrimPrefix(attrErr.Error(), prefix))
}

// bytes renders n bytes as a quantity ("64Mi").
func bytes(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}
