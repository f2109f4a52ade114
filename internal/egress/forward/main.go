// Command sandboxd-forward is sandboxd's helper in a contained agent's
// container, mounted read-only. It has two modes.
//
//	sandboxd-forward serve PORT SOCKET
//
// is the container's main process, as the container's own user: it
// listens on 127.0.0.1:PORT in the container's network namespace and
// hands each connection it accepts to the egress proxy, over the proxy's
// unix socket SOCKET (SCM_RIGHTS), keeping no copy: the proxy serves the
// connection itself, and no byte passes through this program.
//
//	sandboxd-forward stdio SOCKET PORT -- AGENT [ARGS...]
//
// runs the agent, as the commands' user: it waits (10 s at most) for the
// forwarder to listen on PORT (0: no wait), connects to sandboxd's unix
// socket SOCKET, makes that connection the agent's stdin and stdout, and
// executes AGENT, looked up on PATH. The agent's messages then go to
// sandboxd directly, not through the engine's streams.
//
// It uses the syscall package, not net (nor os/user), so that it links
// statically with cgo or without and runs in any image, a busybox one
// too.
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	switch {
	case len(os.Args) == 4 && os.Args[1] == "serve":
		serve(parsePort(os.Args[2], false), os.Args[3])
	case len(os.Args) >= 6 && os.Args[1] == "stdio" && os.Args[4] == "--":
		stdio(os.Args[2], parsePort(os.Args[3], true), os.Args[5:])
	}
	fmt.Fprintln(os.Stderr, "usage: sandboxd-forward serve PORT SOCKET | stdio SOCKET PORT -- AGENT [ARGS...]")
	os.Exit(2)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sandboxd-forward: "+format+"\n", args...)
	os.Exit(127)
}

func parsePort(s string, zero bool) int {
	n, err := strconv.Atoi(s)
	if err != nil || n > 65535 || n < 1 && !(zero && n == 0) {
		fail("bad port %q", s)
	}
	return n
}

// serve hands each connection to 127.0.0.1:port to the proxy on the unix
// socket sock, for ever. One at a time: a proxy that takes none (it is
// at its limit) leaves the rest in the listening socket's backlog.
func serve(port int, sock string) {
	l, err := listen(port)
	if err != nil {
		fail("listen on 127.0.0.1:%d: %v", port, err)
	}
	for {
		c, _, err := syscall.Accept4(l, syscall.SOCK_CLOEXEC)
		if err != nil {
			continue
		}
		handOff(c, sock)
		syscall.Close(c)
	}
}

// handOff passes the connection c to the proxy listening on sock, with one
// byte, as the proxy expects it.
func handOff(c int, sock string) {
	u, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer syscall.Close(u)
	if syscall.Connect(u, &syscall.SockaddrUnix{Name: sock}) != nil {
		return
	}
	syscall.Sendmsg(u, []byte{0}, syscall.UnixRights(c), nil, 0)
}

// stdio runs argv with the unix socket sock as its stdin and stdout, once
// the forwarder listens on port.
func stdio(sock string, port int, argv []string) {
	// Looked up first: an agent the image does not have ends the start
	// before it connects, which sandboxd reports as a failed start.
	path, err := lookPath(argv[0])
	if err != nil {
		fail("cannot run the agent %s: %v (looked up on the container's PATH, %s)", argv[0], err, os.Getenv("PATH"))
	}
	if port > 0 {
		for deadline := time.Now().Add(10 * time.Second); !listening(port); {
			if time.Now().After(deadline) {
				fail("nothing listens on 127.0.0.1:%d, where the egress proxy's forwarder should", port)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: sock})
	}
	if err != nil {
		fail("connect to sandboxd (%s): %v", sock, err)
	}
	for _, to := range []int{0, 1} {
		if err := syscall.Dup3(fd, to, 0); err != nil {
			fail("dup: %v", err)
		}
	}
	syscall.Close(fd)
	err = syscall.Exec(path, argv, os.Environ())
	fail("cannot run the agent %s: %v", argv[0], err)
}

// lookPath finds file as a shell would: a name with a slash as it is,
// else in the directories of PATH.
func lookPath(file string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	for dir := range strings.SplitSeq(os.Getenv("PATH"), ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + file
		if syscall.Access(p, 1) == nil { // X_OK
			var st syscall.Stat_t
			if syscall.Stat(p, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
				return p, nil
			}
		}
	}
	return "", syscall.ENOENT
}

// listening reports whether a socket listens on 127.0.0.1:port, as
// /proc/net/tcp lists the container's.
func listening(port int) bool {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return false
	}
	want := fmt.Sprintf("0100007F:%04X", port)
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		// local_address, rem_address, st: 0A is LISTEN.
		if len(f) > 3 && f[1] == want && f[3] == "0A" {
			return true
		}
	}
	return false
}

// listen returns a listening socket on 127.0.0.1:port.
func listen(port int) (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	if err := syscall.Listen(fd, 128); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}
