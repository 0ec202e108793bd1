# Sourced by the hack scripts that pack images from Debian packages.
#
# debroot DIR PKG=VERSION...: downloads the packages with apt-get
# download (never installing them) into DIR/debs and extracts each into
# DIR/debroot, the tree the image packers read (-debs). From this
# machine's Debian release, or from the one debsuite chose.
debroot() {
	local dir="$1"
	shift
	local apt_opts=(-q "${suite_apt[@]}")
	# apt drops root to _apt for downloads, who cannot write a private work dir.
	((EUID != 0)) || apt_opts+=(-o APT::Sandbox::User=root)
	mkdir -p "$dir/debs" "$dir/debroot"
	if ((${#suite_apt[@]} > 0)); then
		# A merged-/usr release: its packages ship their files under /usr
		# and base-files the links; made first, so that no package's /lib
		# or /bin becomes a directory of its own.
		local d
		for d in bin sbin lib lib64; do
			mkdir -p "$dir/debroot/usr/$d"
			ln -sfn "usr/$d" "$dir/debroot/$d"
		done
	fi
	(cd "$dir/debs" && apt-get download "${apt_opts[@]}" "$@" >&2)
	local deb
	for deb in "$dir"/debs/*.deb; do
		dpkg-deb -x "$deb" "$dir/debroot"
	done
}

# suite_apt: the options debsuite sets for apt-get and apt-cache; empty,
# this machine's own apt.
suite_apt=()

# debsuite DIR SUITE: Debian SUITE (deb.debian.org, main, amd64) for the
# next debroot and debclosure, through an apt state of its own in DIR:
# its package lists are fetched once and kept, and the archive's keys
# that this machine's apt trusts check them. Nothing is installed.
debsuite() {
	local dir="$1" suite="$2"
	mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
	echo "deb http://deb.debian.org/debian $suite main" >"$dir/sources.list"
	suite_apt=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
		-o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o Dir::State::status=/dev/null
		-o APT::Architecture=amd64 -o APT::Install-Recommends=false -o Debug::NoLocking=1)
	((EUID != 0)) || suite_apt+=(-o APT::Sandbox::User=root)
	if ! compgen -G "$dir/lists/*_Packages" >/dev/null; then
		apt-get -q "${suite_apt[@]}" update >&2
	fi
}

# debclosure PKG[=VERSION]...: prints PKG=VERSION for the packages and
# every package they depend on (not recommends), as apt would install
# them on an empty system, one per line, sorted.
debclosure() {
	apt-get -q "${suite_apt[@]}" -s install "$@" |
		sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*/\1=\2/p' | sort
}
