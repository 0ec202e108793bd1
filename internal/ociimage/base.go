package ociimage

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// EnvPath is the PATH of images whose base is StaticBase, as Alpine and
// distroless set it.
const EnvPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// StaticBase is what distroless static holds and static Go binaries use:
// root, nobody and nonroot, /tmp, and the CA bundle that Debian's
// update-ca-certificates makes from ca-certificates' Mozilla set (every
// certificate, in name order, concatenated), read from debroot, where
// Debian's ca-certificates package was extracted (dpkg-deb -x).
func StaticBase(debroot string) (Layer, error) {
	certs, err := filepath.Glob(filepath.Join(debroot, "usr/share/ca-certificates/mozilla/*.crt"))
	if err != nil || len(certs) < 50 {
		return Layer{}, fmt.Errorf("%d certificates in %s/usr/share/ca-certificates/mozilla (extract Debian's ca-certificates there): %v", len(certs), debroot, err)
	}
	slices.Sort(certs)
	var bundle []byte
	for _, c := range certs {
		pem, err := os.ReadFile(c)
		if err != nil {
			return Layer{}, err
		}
		if len(pem) > 0 && pem[len(pem)-1] != '\n' {
			pem = append(pem, '\n')
		}
		bundle = append(bundle, pem...)
	}
	return Layer{CreatedBy: "users, /tmp, Debian 12 ca-certificates", Files: []File{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Data: bundle},
		{Path: "/root", Mode: fs.ModeDir | 0o700},
		{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
	}}, nil
}

// WriteNewLayout writes images as an OCI image layout into dir, which
// must not exist yet (a packer never adds to an old layout), and names
// each image on w.
func WriteNewLayout(dir string, w io.Writer, images ...Image) error {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("%s exists: the layout goes into a new directory", dir)
	}
	if err := WriteLayout(dir, images...); err != nil {
		return err
	}
	for _, im := range images {
		fmt.Fprintln(w, im.Ref)
	}
	return nil
}
