package api

import (
	"fmt"
	"io/fs"
	"math"
)

// The attributes of a volume's root directory that the tmpfs, loop and dir
// backends accept (and any backend may declare with ModeAttr, UIDAttr and
// GIDAttr).
const (
	// ParamMode is the root directory's mode, in octal ("0755", "1777").
	ParamMode = "mode"
	// ParamUID is the root directory's owner, a user ID.
	ParamUID = "uid"
	// ParamGID is the root directory's group, a group ID.
	ParamGID = "gid"
)

// maxID is the largest user or group ID a volume's root may be given:
// 2^32-1 is (uid_t)-1, "no change" to chown(2).
const maxID = math.MaxUint32 - 1

// ModeAttr is the "mode" attribute: an octal permission mode ("0755",
// "1777"; permission, sticky, setgid and setuid bits, see Params.FileMode),
// read with Values.Mode. def is its default (fs.ModeSticky, fs.ModeSetgid and
// fs.ModeSetuid for the special bits); 0 is none.
func ModeAttr(def fs.FileMode) Attribute {
	a := Attribute{Key: ParamMode, kind: kindMode}
	if def != 0 {
		a.def = fmt.Sprintf("%04o", ModeBits(def))
	}
	return a
}

// UIDAttr is the "uid" attribute: a user ID from 0 to 4294967294, read with
// Values.Int. It has no default; refine it with Default ("0").
func UIDAttr() Attribute { return IntAttr(ParamUID, 0, maxID) }

// GIDAttr is the "gid" attribute: a group ID from 0 to 4294967294, read with
// Values.Int. It has no default; refine it with Default.
func GIDAttr() Attribute { return IntAttr(ParamGID, 0, maxID) }
