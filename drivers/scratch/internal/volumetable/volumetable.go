package volumetable

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Row is one volume and the node it is on ("" when the table has no NODE
// column).
type Row struct {
	Node   string
	Volume api.VolumeInfo
}

// Rows are the rows of list, on node.
func Rows(node string, list *api.VolumeList) []Row {
	rows := make([]Row, 0, len(list.Volumes))
	for _, v := range list.Volumes {
		rows = append(rows, Row{Node: node, Volume: v})
	}
	return rows
}

// Print writes rows as a table, with a NODE column when withNode is set. now
// is the time ages are counted to. The table shows short volume IDs
// (ShortIDs); wide shows them whole, with the pod's UID and the target path.
func Print(w io.Writer, rows []Row, withNode, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	head := "VOLUME ID\tNAMESPACE\tPOD\tVOLUME\tBACKEND\tSIZE\tUSED\tPHASE\tAGE"
	if wide {
		head = "VOLUME ID\tNAMESPACE\tPOD\tPOD UID\tVOLUME\tBACKEND\tSIZE\tUSED\tPHASE\tAGE\tTARGET"
	}
	if withNode {
		head = "NODE\t" + head
	}
	fmt.Fprintln(tw, head)
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.Volume.VolumeID
	}
	if !wide {
		ids = ShortIDs(ids)
	}
	for i, r := range rows {
		v := r.Volume
		used := ""
		if v.Usage != nil {
			used = Bytes(v.Usage.BytesUsed)
		}
		size := ""
		if v.Size > 0 {
			size = Bytes(v.Size)
		}
		phase := string(v.Phase)
		if v.Phase == string(store.PhasePublished) && !v.Mounted && v.Error == "" {
			phase += " (not mounted)"
		}
		if v.Rebuilt {
			phase += " (rebuilt)"
		}
		if v.ProvisioningSince != nil {
			phase += " (provisioning " + max(now.Sub(*v.ProvisioningSince), 0).Round(time.Second).String() + ")"
		}
		if withNode {
			fmt.Fprintf(tw, "%s\t", r.Node)
		}
		if wide {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ids[i], dash(v.Pod.Namespace), dash(v.Pod.Name), dash(v.Pod.UID),
				dash(v.VolumeName), v.Backend, size, used, phase, Age(now, v.Created), dash(v.TargetPath))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ids[i], dash(v.Pod.Namespace), dash(v.Pod.Name),
			dash(v.VolumeName), v.Backend, size, used, phase, Age(now, v.Created))
	}
	return tw.Flush()
}

// ShortIDLen is the length of a short volume ID: the kubelet's "csi-"
// and 12 hex digits of the 64 of its ephemeral volume IDs, as container
// runtimes shorten theirs.
const ShortIDLen = 16

// ShortIDs shortens each ID to its first ShortIDLen characters, or more
// where two of them would otherwise read the same: each short ID is a prefix
// of its volume's ID (grep finds it in mountinfo and the logs) and names one
// volume of the list.
func ShortIDs(ids []string) []string {
	for n := ShortIDLen; ; n++ {
		out := make([]string, len(ids))
		of := make(map[string]string, len(ids)) // short ID → the ID it stands for
		unique, long := true, false
		for i, id := range ids {
			out[i] = id[:min(n, len(id))]
			long = long || len(id) > n
			if other, ok := of[out[i]]; ok && other != id {
				unique = false
			}
			of[out[i]] = id
		}
		if unique || !long {
			return out
		}
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Bytes prints n bytes in binary units, as Kubernetes quantities read them
// (64Mi; 1.5Gi rounded to one decimal).
func Bytes(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d", n)
	}
	f, i := float64(n)/1024, 0
	for ; f >= 1024 && i < len(units)-1; i++ {
		f /= 1024
	}
	s := strings.TrimSuffix(fmt.Sprintf("%.1f", f), ".0")
	return s + string(units[i]) + "i"
}

// Age prints how long ago t was, as kubectl does (45s, 12m, 5h, 3d).
func Age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}
