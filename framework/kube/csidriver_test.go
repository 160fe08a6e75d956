package kube

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"github.com/ephemera-csi/ephemera/api"
)

// csiDriverObject is a CSIDriver as kube-apiserver v1.34 returns it, with
// fields GetCSIDriver does not read.
const csiDriverObject = `{"kind":"CSIDriver","apiVersion":"storage.k8s.io/v1",
 "metadata":{"name":"scratch.csi.ephemera.dev","uid":"0d3c5b2e-1111-4a7e-9c51-2f1f4f6f0a01","resourceVersion":"42",
  "labels":{"security.openshift.io/csi-ephemeral-volume-profile":"restricted"},
  "managedFields":[{"manager":"kubectl","operation":"Apply","apiVersion":"storage.k8s.io/v1","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{}}}]},
 "spec":{"attachRequired":false,"podInfoOnMount":true,"volumeLifecycleModes":["Ephemeral"],"storageCapacity":false,
  "fsGroupPolicy":"File","requiresRepublish":false,"seLinuxMount":false,"tokenRequests":[{"audience":"vault"}]}}`

// The API server's 404 for a missing object.
const notFoundStatus = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
 "message":"csidrivers.storage.k8s.io \"other\" not found","reason":"NotFound",
 "details":{"name":"other","group":"storage.k8s.io","kind":"csidrivers"},"code":404}`

const forbiddenStatus = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
 "message":"csidrivers.storage.k8s.io \"x\" is forbidden: User \"system:serviceaccount:kube-system:ephemera-scratch-node\" cannot get resource \"csidrivers\" in API group \"storage.k8s.io\" at the cluster scope",
 "reason":"Forbidden","details":{"name":"x","group":"storage.k8s.io","kind":"csidrivers"},"code":403}`

func TestGetCSIDriver(t *testing.T) {
	c, seen := fakeAPIServer(t, rest.Config{}, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/apis/storage.k8s.io/v1/csidrivers/scratch.csi.ephemera.dev":
			fmt.Fprint(w, csiDriverObject)
		case "/apis/storage.k8s.io/v1/csidrivers/x":
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, forbiddenStatus)
		default:
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, notFoundStatus)
		}
	})

	got, err := c.GetCSIDriver(t.Context(), "scratch.csi.ephemera.dev")
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "scratch.csi.ephemera.dev" || got.UID != "0d3c5b2e-1111-4a7e-9c51-2f1f4f6f0a01" ||
		got.AttachRequired == nil || *got.AttachRequired || got.PodInfoOnMount == nil || !*got.PodInfoOnMount ||
		len(got.VolumeLifecycleModes) != 1 || got.VolumeLifecycleModes[0] != "Ephemeral" ||
		got.FSGroupPolicy == nil || *got.FSGroupPolicy != "File" || got.RequiresRepublish == nil || *got.RequiresRepublish {
		t.Errorf("GetCSIDriver = %+v", got)
	}
	if want := "GET /apis/storage.k8s.io/v1/csidrivers/scratch.csi.ephemera.dev?resourceVersion=0 application/json, */*"; seen()[0].uri()+" "+seen()[0].accept != want {
		t.Errorf("request %q, want %q", seen()[0].uri()+" "+seen()[0].accept, want)
	}

	if _, err := c.GetCSIDriver(t.Context(), "other"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("missing object: %v, want api.ErrNotFound", err)
	}
	_, err = c.GetCSIDriver(t.Context(), "x")
	if errors.Is(err, api.ErrNotFound) || !apierrors.IsForbidden(err) {
		t.Errorf("forbidden: %v, want an API Forbidden error", err)
	}
}

// DaemonSetSize reads status.desiredNumberScheduled with one GET from the
// watch cache; a missing DaemonSet wraps api.ErrNotFound, a refusal keeps
// the API server's reason.
func TestDaemonSetSize(t *testing.T) {
	c, seen := fakeAPIServer(t, rest.Config{}, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/apis/apps/v1/namespaces/kube-system/daemonsets/ephemera-scratch-node":
			fmt.Fprint(w, `{"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"ephemera-scratch-node","namespace":"kube-system"},
 "spec":{"updateStrategy":{"type":"RollingUpdate"}},
 "status":{"currentNumberScheduled":998,"numberMisscheduled":0,"desiredNumberScheduled":1000,"numberReady":990}}`)
		case "/apis/apps/v1/namespaces/kube-system/daemonsets/forbidden":
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, forbiddenStatus)
		default:
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, notFoundStatus)
		}
	})
	if n, err := c.DaemonSetSize(t.Context(), "kube-system", "ephemera-scratch-node"); err != nil || n != 1000 {
		t.Errorf("DaemonSetSize = %d, %v, want 1000", n, err)
	}
	if reqs := seen(); len(reqs) != 1 || reqs[0].uri() != "GET /apis/apps/v1/namespaces/kube-system/daemonsets/ephemera-scratch-node?resourceVersion=0" {
		t.Errorf("requests %+v, want one GET from the watch cache", reqs)
	}
	if _, err := c.DaemonSetSize(t.Context(), "kube-system", "gone"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("missing DaemonSet: %v, want api.ErrNotFound", err)
	}
	if _, err := c.DaemonSetSize(t.Context(), "kube-system", "forbidden"); !apierrors.IsForbidden(err) {
		t.Errorf("forbidden: %v, want the API server's Forbidden", err)
	}
	if _, err := c.DaemonSetSize(t.Context(), "", "x"); err == nil || len(seen()) != 3 {
		t.Errorf("no namespace: %v after %d requests, want an error and no request", err, len(seen()))
	}
}
