package plugin

import (
	"time"

	"github.com/ephemera-csi/ephemera/api"
	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
)

// toProto is v as the protocol carries it: never its secrets or tokens, which
// go on the calls that need them, nor the driver's own state keys.
func toProto(v *api.Volume) *pb.Volume {
	pv := &pb.Volume{
		Id:   v.ID,
		Name: v.Name,
		Pod: &pb.Pod{
			Namespace:      v.Pod.Namespace,
			Name:           v.Pod.Name,
			Uid:            v.Pod.UID,
			ServiceAccount: v.Pod.ServiceAccount,
		},
		Attributes: v.Params,
		SizeBytes:  v.Size,
		ReadOnly:   v.ReadOnly,
		FsGroup:    v.FSGroup,
		FsType:     v.FSType,
	}
	if len(v.State) > 0 {
		pv.State = make(map[string]string, len(v.State))
		for k, val := range v.State {
			if !reserved(k) {
				pv.State[k] = val
			}
		}
	}
	return pv
}

// FromProto is the api.Volume a plugin receives, without secrets and tokens.
func FromProto(pv *pb.Volume, backend string) *api.Volume {
	v := &api.Volume{
		ID:   pv.GetId(),
		Name: pv.GetName(),
		Pod: api.Pod{
			Namespace:      pv.GetPod().GetNamespace(),
			Name:           pv.GetPod().GetName(),
			UID:            pv.GetPod().GetUid(),
			ServiceAccount: pv.GetPod().GetServiceAccount(),
		},
		Backend:  backend,
		ReadOnly: pv.GetReadOnly(),
		FSType:   pv.GetFsType(),
		FSGroup:  pv.FsGroup,
		Size:     pv.GetSizeBytes(),
		Params:   api.Params(pv.GetAttributes()),
		State:    pv.GetState(),
	}
	if v.Params == nil {
		v.Params = api.Params{}
	}
	return v
}

// tokensToProto converts the pod's tokens for Create and Content.
func tokensToProto(ts api.Tokens) map[string]*pb.Token {
	if len(ts) == 0 {
		return nil
	}
	out := make(map[string]*pb.Token, len(ts))
	for aud, t := range ts {
		out[aud] = &pb.Token{Token: t.Token, ExpirationUnix: t.ExpirationTimestamp.Unix()}
	}
	return out
}

// TokensFromProto converts the tokens of a Create or Content request.
func TokensFromProto(ts map[string]*pb.Token) api.Tokens {
	if len(ts) == 0 {
		return nil
	}
	out := make(api.Tokens, len(ts))
	for aud, t := range ts {
		out[aud] = api.Token{Token: t.GetToken(), ExpirationTimestamp: time.Unix(t.GetExpirationUnix(), 0).UTC()}
	}
	return out
}
