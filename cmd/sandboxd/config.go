package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/sandboxd/sandboxd"
)

// cmdConfig prints the embedded default configuration.
func cmdConfig(args []string, stdout, stderr io.Writer) error {
	return cmdPrint("config", "Prints the embedded default configuration, sandbox.toml, which --config FILE\noverrides key by key.",
		sandboxd.DefaultConfig, args, stdout, stderr)
}

// cmdVersion prints version().
func cmdVersion(args []string, stdout, stderr io.Writer) error {
	return cmdPrint("version", "Prints the module version, the commit the build recorded and the Go version.",
		version()+"\n", args, stdout, stderr)
}

// cmdPrint is a command without flags or arguments that prints text.
func cmdPrint(name, about, text string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, name, about, stderr)
	if err := parseNoArgs(fs, args, stdout); err != nil {
		return err
	}
	if _, err := fmt.Fprint(stdout, text); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// version names the module version sandboxd was built from, and the VCS
// revision when the build recorded one.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "sandboxd (version unknown)"
	}
	v := "sandboxd " + bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v += " " + s.Value[:min(12, len(s.Value))]
		case "vcs.modified":
			if s.Value == "true" {
				v += " (modified)"
			}
		}
	}
	return v + " " + bi.GoVersion
}
