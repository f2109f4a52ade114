package ahp

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteToken(t *testing.T) {
	t.Run("a link at the name is replaced, not followed", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "elsewhere")
		if err := os.WriteFile(target, nil, 0o666); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, "token")
		if err := os.Symlink(target, file); err != nil {
			t.Fatal(err)
		}
		if err := WriteToken(file, "secret"); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(target); len(b) != 0 {
			t.Errorf("the link's target got %q", b)
		}
		fi, err := os.Lstat(file)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Fatalf("token file: %v, %v; want a regular file of mode 600", fi.Mode(), err)
		}
		if b, _ := os.ReadFile(file); string(b) != "secret\n" {
			t.Errorf("token file holds %q", b)
		}
	})
	t.Run("a directory others may write to is refused", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "shared")
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		err := WriteToken(filepath.Join(dir, "token"), "secret")
		if err == nil || !strings.Contains(err.Error(), "others may write to") {
			t.Errorf("err = %v", err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("left %v behind", entries)
		}
	})
	t.Run("a sticky directory such as /tmp is fine", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "sticky")
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
			t.Fatal(err)
		}
		if err := WriteToken(filepath.Join(dir, "token"), "secret"); err != nil {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("removed only while it holds the token", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "token")
		if err := WriteToken(file, "mine"); err != nil {
			t.Fatal(err)
		}
		RemoveToken(file, "theirs")
		if _, err := os.Stat(file); err != nil {
			t.Errorf("another instance's token was removed: %v", err)
		}
		RemoveToken(file, "mine")
		if _, err := os.Stat(file); !os.IsNotExist(err) {
			t.Errorf("token file still there: %v", err)
		}
	})
}

// TestTokenFile: the default token file is in the user's cache directory,
// named by the port, and there is none without a cache directory (no
// shared fallback).
func TestTokenFile(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/cache")
	got, err := TokenFile(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7681})
	if err != nil || got != "/cache/sandboxd/ahp-token-7681" {
		t.Errorf("TokenFile = %q, %v", got, err)
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "")
	if got, err := TokenFile(&net.TCPAddr{Port: 1}); err == nil {
		t.Errorf("TokenFile without a cache directory = %q", got)
	}
}
