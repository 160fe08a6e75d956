package manifests

import "testing"

// clusterScoped is every kind a deployment renders that has no namespace.
// A kind missing from both lists fails TestNamespaces: say which it is.
var clusterScoped = map[string]bool{
	"CSIDriver": true, "ClusterRole": true, "ClusterRoleBinding": true,
	"FlowSchema": true, "PriorityLevelConfiguration": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
	"DaemonSet": false, "ServiceAccount": false, "NetworkPolicy": false,
	"PodMonitor": false, "PrometheusRule": false,
}

// TestNamespaces: every namespaced object of every rendering names its
// namespace, and no cluster-scoped one sets one. The API server ignores the
// namespace of a cluster-scoped object, but strict clients (and the e2e's
// dry run) refuse it; kustomize sets it on kinds its built-in schema does not
// know, so a new kind (or a new kustomization with namespace:) shows here.
func TestNamespaces(t *testing.T) {
	for _, r := range renderAll(t) {
		for _, o := range r.objs {
			scoped, known := clusterScoped[o.Kind()]
			ns, _ := o.Get("metadata", "namespace").(string)
			switch {
			case !known:
				t.Errorf("%s: %s %s: kind not in clusterScoped (namespace_test.go)", r.Name, o.Kind(), o.Name())
			case scoped && ns != "":
				t.Errorf("%s: %s %s is cluster-scoped but sets namespace %q", r.Name, o.Kind(), o.Name(), ns)
			case !scoped && ns == "":
				t.Errorf("%s: %s %s names no namespace", r.Name, o.Kind(), o.Name())
			}
		}
	}
}
