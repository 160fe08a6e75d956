package manifests

import (
	"fmt"
	"testing"
)

// TestFlowControl: every deployment of a driver ships a FlowSchema that sends
// its ServiceAccount's requests (every verb and resource) to a small Limited
// priority level of its own, matched before the bootstrap schema
// kube-system-service-accounts (precedence 900); both objects are
// cluster-scoped. The chart's flowControl.enabled=false renders neither.
func TestFlowControl(t *testing.T) {
	for _, r := range renderAll(t) {
		if r.Kustomize == "deploy/admission" {
			continue
		}
		checkFlowControl(t, r)
	}
	off := helmObjects(t, map[string]any{"flowControl": map[string]any{"enabled": false}})
	if n := len(off.find("FlowSchema")) + len(off.find("PriorityLevelConfiguration")); n != 0 {
		t.Errorf("flowControl.enabled=false: %d flow-control objects, want none", n)
	}
	custom := helmObjects(t, map[string]any{"flowControl": map[string]any{"nominalConcurrencyShares": 3, "queueLengthLimit": 7, "matchingPrecedence": 700}})
	checkFlowControl(t, custom)
	plc := custom.find("PriorityLevelConfiguration")[0]
	if fmt.Sprint(plc.Get("spec", "limited", "nominalConcurrencyShares"), plc.Get("spec", "limited", "limitResponse", "queuing", "queueLengthLimit"),
		custom.find("FlowSchema")[0].Get("spec", "matchingPrecedence")) != "3 7 700" {
		t.Errorf("values not rendered: %v", plc)
	}
}

func checkFlowControl(t *testing.T, r rendered) {
	t.Helper()
	fss, plcs := r.find("FlowSchema"), r.find("PriorityLevelConfiguration")
	if len(fss) != 1 || len(plcs) != 1 {
		t.Errorf("%s: %d FlowSchemas, %d PriorityLevelConfigurations, want 1 each", r.Name, len(fss), len(plcs))
		return
	}
	fs, plc := fss[0], plcs[0]
	for _, o := range []Object{fs, plc} {
		ns := o.Get("metadata", "namespace")
		if o.Get("apiVersion") != "flowcontrol.apiserver.k8s.io/v1" || ns != nil {
			t.Errorf("%s: %s %s: apiVersion %v, namespace %v, want flowcontrol.apiserver.k8s.io/v1, cluster-scoped",
				r.Name, o.Kind(), o.Name(), o.Get("apiVersion"), o.Get("metadata", "namespace"))
		}
	}
	if fs.Get("spec", "priorityLevelConfiguration", "name") != plc.Name() {
		t.Errorf("%s: FlowSchema sends to %v, want %s", r.Name, fs.Get("spec", "priorityLevelConfiguration", "name"), plc.Name())
	}
	if p, ok := fs.Get("spec", "matchingPrecedence").(float64); !ok || p <= 1 || p >= 900 {
		t.Errorf("%s: matchingPrecedence %v, want within (1, 900): before kube-system-service-accounts", r.Name, fs.Get("spec", "matchingPrecedence"))
	}
	sa := r.find("ServiceAccount")[0]
	subj := fs.Get("spec", "rules", 0, "subjects", 0)
	if fmt.Sprint(subj) != fmt.Sprint(map[string]any{"kind": "ServiceAccount", "serviceAccount": map[string]any{"name": sa.Name(), "namespace": Namespace}}) {
		t.Errorf("%s: FlowSchema subject %v, want ServiceAccount %s/%s", r.Name, subj, Namespace, sa.Name())
	}
	rr := fmt.Sprint(fs.Get("spec", "rules", 0, "resourceRules", 0))
	if want := fmt.Sprint(map[string]any{"verbs": []any{"*"}, "apiGroups": []any{"*"}, "resources": []any{"*"}, "clusterScope": true, "namespaces": []any{"*"}}); rr != want {
		t.Errorf("%s: resourceRules %s, want every request (%s)", r.Name, rr, want)
	}
	if plc.Get("spec", "type") != "Limited" || plc.Get("spec", "limited", "limitResponse", "type") != "Queue" {
		t.Errorf("%s: priority level %v, want Limited with queuing", r.Name, plc.Get("spec"))
	}
	if s, _ := plc.Get("spec", "limited", "nominalConcurrencyShares").(float64); s < 1 || s > 20 {
		t.Errorf("%s: nominalConcurrencyShares %v, want a small level (1..20 of the bootstrap 245)", r.Name, s)
	}
}
