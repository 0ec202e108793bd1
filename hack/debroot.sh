# Sourced by the hack scripts that pack images from Debian packages.
#
# debroot DIR PKG=VERSION...: downloads the packages with apt-get
# download (never installing them) into DIR/debs and extracts each into
# DIR/debroot, the tree the image packers read (-debs).
debroot() {
	local dir="$1"
	shift
	local apt_opts=(-q)
	# apt drops root to _apt for downloads, who cannot write a private work dir.
	((EUID != 0)) || apt_opts+=(-o APT::Sandbox::User=root)
	mkdir -p "$dir/debs" "$dir/debroot"
	(cd "$dir/debs" && apt-get download "${apt_opts[@]}" "$@" >&2)
	local deb
	for deb in "$dir"/debs/*.deb; do
		dpkg-deb -x "$deb" "$dir/debroot"
	done
}
