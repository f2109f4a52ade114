package integration

import (
	"archive/tar"
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// setidScript runs, as the session's user, every way busybox offers to
// give a file a setuid or setgid bit, in the workspace and in /tmp, and
// the direct system calls of testsetid (mounted at /opt/setid); then it
// lists what in /tmp has such a bit. Each try prints "WHERE/NAME ok" or
// "WHERE/NAME fail: MESSAGE".
const setidScript = `
try() { n=$1; shift; if out=$("$@" 2>&1); then echo "$where/$n ok"; else echo "$where/$n fail: $out"; fi; }
ws=$PWD
mkdir /tmp/sh
for where in ws tmp; do
	d=$ws; [ $where = tmp ] && d=/tmp/sh
	touch $d/a $d/b; mkdir $d/x
	try bb-chmod-4755 chmod 4755 $d/a
	try bb-chmod-g+s chmod g+s $d/a
	try bb-chmod-u+s chmod u+s $d/a
	try bb-mkdir-m-2755 mkdir -m 2755 $d/d
	try bb-mkfifo-m-4755 mkfifo -m 4755 $d/p
	try bb-mknod-m-2755 mknod -m 2755 $d/q p
	try bb-cp-setuid cp $ws/host-suid $d/c
	try bb-cp-p-setuid cp -p $ws/host-suid $d/cp
	try bb-tar-x-setuid tar xf $ws/suid.tar -C $d/x
	try bb-chmod-755 chmod 755 $d/a
	try bb-chmod+x chmod +x $d/b
done
/opt/setid/testsetid $ws/h | sed 's,^,ws/,'
/opt/setid/testsetid /tmp/h | sed 's,^,tmp/,'
find /tmp/sh /tmp/h \( -perm -4000 -o -perm -2000 \) -print | sed 's,^,setid ,'
`

// TestSetidBitsRefused: no command gives a file a setuid or setgid bit,
// neither by changing a mode nor by creating a file with one, through
// busybox or the system calls themselves: each try fails with EPERM, and
// no file in the workspace has such a bit on the host. Plain changes of
// mode still work. With refuse_setid = false the bits are given (so the
// checks do see them).
func TestSetidBitsRefused(t *testing.T) {
	bin, err := buildHelper("testsetid")
	if err != nil {
		t.Fatal(err)
	}
	helpers := filepath.Dir(bin)
	t.Cleanup(func() { os.RemoveAll(helpers) })
	if err := os.Chmod(helpers, 0o755); err != nil {
		t.Fatal(err)
	}
	ws := workspace(t)
	// A setuid file the person made, for cp and tar to copy.
	suid := filepath.Join(ws, "host-suid")
	writeFile(t, suid, "#!/bin/sh\n")
	own(t, suid)
	if err := os.Chmod(suid, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	writeSetidTar(t, filepath.Join(ws, "suid.tar"))

	r := runSandboxd(t, ws, nil, nil, "run", "--config", testEnv.config, "-v", helpers+":/opt/setid:ro", "--", "sh", "-c", setidScript)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.output())
	}
	t.Logf("output:\n%s", r.output())
	got := map[string]string{}
	for sc := bufio.NewScanner(strings.NewReader(r.stdout)); sc.Scan(); {
		name, result, _ := strings.Cut(sc.Text(), " ")
		if name == "setid" {
			t.Errorf("%s has a setuid or setgid bit in the container", result)
		}
		got[name] = result
	}
	refused := "Operation not permitted"
	want := map[string]string{
		// busybox: a message
		"bb-chmod-4755": refused, "bb-chmod-g+s": refused, "bb-chmod-u+s": refused,
		"bb-mkdir-m-2755": refused, "bb-mkfifo-m-4755": refused, "bb-mknod-m-2755": refused,
		"bb-cp-setuid": refused, "bb-cp-p-setuid": refused, "bb-tar-x-setuid": refused,
		"bb-chmod-755": "ok", "bb-chmod+x": "ok",
		// testsetid: the errno
		"openat-creat-4755": "EPERM", "openat-creat-2755": "EPERM", "openat-tmpfile-4755": "EPERM",
		"fchmod-4755": "EPERM", "fchmodat-2755": "EPERM", "mknodat-4755": "EPERM", "mkdirat-2755": "EPERM",
		"openat-creat-0755": "ok", "fchmodat-0755": "ok", "mkdirat-0755": "ok",
		// Its mode lies where seccomp cannot read it: refused as by a
		// kernel without it, so that callers fall back to openat.
		"openat2-creat-4755": "ENOSYS",
	}
	// Only amd64 has these; elsewhere they are not tried.
	amd64 := map[string]string{
		"open-creat-4755": "EPERM", "creat-2755": "EPERM", "chmod-4755": "EPERM",
		"mkdir-2755": "EPERM", "mknod-2755": "EPERM", "chmod-0755": "ok",
	}
	for _, where := range []string{"ws", "tmp"} {
		for name, w := range want {
			res := got[where+"/"+name]
			if w == refused && (!strings.HasPrefix(res, "fail") || !strings.Contains(res, refused)) || w != refused && res != w {
				t.Errorf("%s/%s: %q, want %q", where, name, res, w)
			}
		}
		for name, w := range amd64 {
			if res, ok := got[where+"/"+name]; ok && res != w {
				t.Errorf("%s/%s: %q, want %q", where, name, res, w)
			}
		}
		// An engine whose libseccomp lacks fchmodat2 refuses it as unknown.
		if res := got[where+"/fchmodat2-4755"]; res != "EPERM" && res != "ENOSYS" {
			t.Errorf("%s/fchmodat2-4755: %q, want EPERM or ENOSYS", where, res)
		}
		if res := got[where+"/io_uring_setup"]; res == "ok" || res == "" {
			t.Errorf("%s/io_uring_setup: %q, want it refused", where, res)
		}
	}
	// On the host: the bits are on no file the command made, and the
	// plain changes took.
	filepath.WalkDir(ws, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			t.Error(err)
			return nil
		}
		if fi, err := os.Lstat(p); err == nil && p != suid && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s on the host: mode %v", p, fi.Mode())
		}
		return nil
	})
	for name, want := range map[string]os.FileMode{"a": 0o755, "b": 0o755} {
		if fi, err := os.Stat(filepath.Join(ws, name)); err != nil || fi.Mode().Perm()&want != want {
			t.Errorf("%s on the host: %v, %v; want mode %v", name, fi.Mode(), err, want)
		}
	}

	// Relaxed, the same command gives the bit: the checks above see it.
	cfg := filepath.Join(t.TempDir(), "relaxed.toml")
	writeFile(t, cfg, strings.Replace(testConfig, "[session]\n", "[session]\nrefuse_setid = false\n", 1))
	ws2 := workspace(t)
	if r := runSandboxd(t, ws2, nil, nil, "run", "--config", cfg, "--", "sh", "-c", "touch a && chmod 4755 a"); r.code != 0 {
		t.Fatalf("refuse_setid = false: exit %d: %s", r.code, r.output())
	}
	if fi, err := os.Stat(filepath.Join(ws2, "a")); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("refuse_setid = false: %v, %v; want the setuid bit", fi.Mode(), err)
	}
}

// writeSetidTar writes an archive of one file "suid" with mode 4755.
func writeSetidTar(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := tar.NewWriter(f)
	body := "#!/bin/sh\n"
	if err := w.WriteHeader(&tar.Header{Name: "suid", Mode: 0o4755, Size: int64(len(body)), Uid: 1000, Gid: 1000, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	own(t, path)
}
