package ociimage

import "testing"

func TestFileCaps(t *testing.T) {
	for _, tc := range []struct {
		caps []uint
		want string
	}{
		// getfattr -n security.capability after setcap cap_net_bind_service+eip.
		{[]uint{CapNetBindService}, "\x01\x00\x00\x02\x00\x04\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"},
		// cap_net_admin,cap_net_raw,cap_net_bind_service,cap_sys_admin+eip.
		{[]uint{CapNetAdmin, CapNetRaw, CapNetBindService, CapSysAdmin}, "\x01\x00\x00\x02\x00\x34\x20\x00\x00\x34\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00"},
	} {
		if got := FileCaps(tc.caps...); got != tc.want {
			t.Errorf("FileCaps(%v) = %q, want %q", tc.caps, got, tc.want)
		}
	}
}
