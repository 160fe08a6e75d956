// Package volumetable prints a api.VolumeList as the table of
// "ephemera-scratch volumes" and "kubectl ephemera volumes".
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
// is the time ages are counted to.
func Print(w io.Writer, rows []Row, withNode bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	head := "VOLUME ID\tNAMESPACE\tPOD\tPOD UID\tVOLUME\tBACKEND\tSIZE\tUSED\tPHASE\tAGE"
	if withNode {
		head = "NODE\t" + head
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
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
		if withNode {
			fmt.Fprintf(tw, "%s\t", r.Node)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.VolumeID, dash(v.Pod.Namespace), dash(v.Pod.Name), dash(v.Pod.UID),
			dash(v.VolumeName), v.Backend, size, used, phase, Age(now, v.Created))
	}
	return tw.Flush()
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
