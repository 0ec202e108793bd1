package ociimage

import "encoding/binary"

// Linux capability numbers (linux/capability.h) that images grant their
// binaries.
const (
	CapNetBindService = 10
	CapNetAdmin       = 12
	CapNetRaw         = 13
	CapSysModule      = 16
	CapSysAdmin       = 21
	CapSysNice        = 23
)

// FileCaps is the security.capability attribute that `setcap
// CAPS+eip` writes (struct vfs_cap_data, revision 2, effective): a
// binary that keeps these capabilities when a user other than root runs
// it, as upstream images give theirs.
func FileCaps(caps ...uint) string {
	var permitted [2]uint32
	for _, c := range caps {
		permitted[c/32] |= 1 << (c % 32)
	}
	const revision2, effective = 0x02000000, 0x000001
	b := binary.LittleEndian.AppendUint32(nil, revision2|effective)
	// Permitted and inheritable, low 32 bits then high; the inheritable
	// set is what +i asks for, the same as permitted.
	b = binary.LittleEndian.AppendUint32(b, permitted[0])
	b = binary.LittleEndian.AppendUint32(b, permitted[0])
	b = binary.LittleEndian.AppendUint32(b, permitted[1])
	b = binary.LittleEndian.AppendUint32(b, permitted[1])
	return string(b)
}
