// Package volumetable prints a api.VolumeList as the table of
// "ephemera-scratch volumes" and "kubectl ephemera volumes": one [Row] per
// volume, written by [Print].
package volumetable
