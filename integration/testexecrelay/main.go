// Command testexecrelay is the floor of any process between a terminal
// client and the engine: it attaches to a TTY exec of bash in a container,
// listens on a loopback TCP port and copies bytes both ways without looking
// at them. The AHP keystroke benchmark measures sandboxd against it, to
// tell sandboxd's own work from the cost of the extra process in the path.
//
//	testexecrelay CONTAINER
//
// It prints the address it listens on, serves one connection and exits
// when that connection or the exec ends.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/sandboxd/sandboxd/internal/engine"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: testexecrelay CONTAINER")
		os.Exit(2)
	}
	if err := relay(context.Background(), os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "testexecrelay:", err)
		os.Exit(1)
	}
}

func relay(ctx context.Context, container string) error {
	cli, err := engine.New()
	if err != nil {
		return err
	}
	ex, err := cli.ExecCreate(ctx, container, engine.ExecCreateOptions{User: "1000:1000", TTY: true, AttachStdin: true, AttachStdout: true, AttachStderr: true, Cmd: []string{"bash", "--norc", "-i"}})
	if err != nil {
		return err
	}
	att, err := cli.ExecAttach(ctx, ex.ID, engine.ExecAttachOptions{TTY: true})
	if err != nil {
		return err
	}
	defer att.Close()
	// API 1.41 ignores ConsoleSize: size the PTY as sandboxd does.
	if _, err := cli.ExecResize(ctx, ex.ID, engine.ExecResizeOptions{Width: 1000, Height: 24}); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr())
	c, err := ln.Accept()
	ln.Close()
	if err != nil {
		return err
	}
	defer c.Close()
	// Either side ending ends the relay.
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(att.Conn, c)
		done <- struct{}{}
	}()
	go func() {
		io.Copy(c, att.Reader)
		done <- struct{}{}
	}()
	<-done
	return nil
}
