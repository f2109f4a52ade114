package sandbox

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
)

// gitRepo is a repository whose config host git reads: its git
// directory, the common directory that names ("" for none), and the
// working tree it was found at ("" for none known).
type gitRepo struct{ gitdir, common, worktree string }

// gitTarget is a path that a repository's config makes host git read
// config from or run, as the config names it, made absolute (its links
// not resolved). dir marks a directory (of hooks, of templates); the rest
// are files.
type gitTarget struct {
	path string
	dir  bool
	why  string // the variable and the file that sets it
}

// Limits on what one repository's config makes sandboxd read: git itself
// stops at 10 levels of includes.
const (
	maxIncludeDepth = 10
	maxConfigFiles  = 64
	maxConfigBytes  = 1 << 20
)

// configTargets returns what the config of repo makes host git read
// config from or execute, wherever it lies:
//
//   - the files include.path and includeIf.<condition>.path name, relative
//     to the file that names them, every condition taken as met, and what
//     those include in turn;
//   - the directory core.hooksPath names, relative to the working tree (to
//     the git directory in a bare repository), and init.templateDir, whose
//     hooks `git init` copies in;
//   - the program of every variable git runs as a command, when the
//     command's first word names it by a path (holds a slash): core.fsmonitor
//     (unless a boolean), core.editor, core.pager, core.sshCommand,
//     core.askPass, core.gitProxy, core.alternateRefsCommand,
//     sequence.editor, interactive.diffFilter, diff.external,
//     diff.<driver>.command and .textconv, merge.<driver>.driver,
//     filter.<driver>.clean, .smudge and .process, difftool and mergetool
//     .<tool>.cmd and .path, browser and man .<tool>.cmd and .path,
//     guitool.<name>.cmd, pager.<command>, gpg.program, gpg.<format>.program,
//     gpg.ssh.defaultKeyCommand, remote.<name>.uploadpack and .receivepack,
//     uploadpack.packObjectsHook, sendemail.toCmd, .ccCmd, .sendmailCmd and
//     .smtpServer, imap.tunnel, hook.<name>.command,
//     trailer.<token>.command and .cmd, and, after a "!", alias.<name>,
//     credential.helper (also an absolute path) and
//     submodule.<name>.update. Relative ones are taken from the working
//     tree, where git runs them.
//
// The config files read are the git directory's config and
// config.worktree (extensions.worktreeConfig) and the common directory's
// config. home gives the home directories "~" (user "") or "~user"
// stands for; the bytes read are taken from *budget. What cannot be told
// (a command that starts with an expansion, a path through git's runtime
// prefix) is left out: such a program is the person's own choice, as is
// every other file a command of theirs reads.
func configTargets(repo gitRepo, home func(user string) []string, budget *int64) ([]gitTarget, []gitNote) {
	r := configReader{home: home, seen: map[string]bool{}, budget: budget}
	files := []string{filepath.Join(repo.gitdir, "config"), filepath.Join(repo.gitdir, "config.worktree")}
	if repo.common != "" {
		files = append(files, filepath.Join(repo.common, "config"))
	}
	for _, f := range files {
		r.read(f, 0)
	}
	// Where git runs hooks and commands: the working tree, which
	// core.worktree (relative to the git directory) may move; the git
	// directory of a bare repository.
	var bases []string
	if repo.worktree != "" {
		bases = append(bases, repo.worktree)
	}
	for _, v := range r.worktrees {
		bases = append(bases, joinConfigPath(repo.gitdir, v))
	}
	if r.bare || len(bases) == 0 {
		bases = append(bases, repo.gitdir)
	}
	targets := r.includes
	for _, u := range r.uses {
		for _, p := range r.locate(u.value, bases) {
			targets = append(targets, gitTarget{path: p, dir: u.dir, why: u.why})
		}
	}
	return targets, r.notes
}

// configUse is a path a config file names, to be taken from where git
// runs.
type configUse struct {
	value string
	dir   bool
	why   string
}

// configReader gathers what a repository's config files name.
type configReader struct {
	home      func(string) []string
	budget    *int64
	seen      map[string]bool
	includes  []gitTarget
	uses      []configUse
	worktrees []string
	bare      bool
	full      bool // maxConfigFiles read
	notes     []gitNote
}

// read reads one config file and what it includes.
func (r *configReader) read(file string, depth int) {
	key, _, err := resolvePath(file)
	if err != nil || r.seen[key] || depth > maxIncludeDepth {
		return
	}
	if len(r.seen) >= maxConfigFiles {
		if !r.full { // once: a config may name thousands
			r.notes = append(r.notes, gitNote{file, fmt.Sprintf("not read, nor what else it includes: the repository's config includes more than %d files", maxConfigFiles)})
		}
		r.full = true
		return
	}
	r.seen[key] = true
	if *r.budget <= 0 {
		r.notes = append(r.notes, gitNote{file, fmt.Sprintf("not read: the repository's config is more than the %d MiB sandboxd reads", configBudget>>20)})
		return
	}
	b := readSmallFile(file, maxConfigBytes+1)
	if len(b) > maxConfigBytes {
		r.notes = append(r.notes, gitNote{file, fmt.Sprintf("read only in part: larger than %d MiB", maxConfigBytes>>20)})
		b = b[:maxConfigBytes]
	}
	*r.budget -= int64(len(b))
	for _, v := range parseGitConfig(b) {
		why := v.name() + " in " + file
		switch {
		case v.key == "path" && (v.section == "include" && v.subsection == "" || v.section == "includeif") && !v.valueless && v.value != "":
			// From the directory of the file as it was named, which the
			// kernel walks, not as cleaned.
			for _, p := range r.locate(v.value, []string{file[:strings.LastIndexByte(file, '/')]}) {
				r.includes = append(r.includes, gitTarget{path: p, why: why})
				r.read(p, depth+1)
			}
		case v.section == "core" && v.subsection == "" && v.key == "hookspath" && v.value != "",
			v.section == "init" && v.subsection == "" && v.key == "templatedir" && v.value != "":
			r.uses = append(r.uses, configUse{value: v.value, dir: true, why: why})
		case v.section == "core" && v.subsection == "" && v.key == "worktree" && v.value != "":
			r.worktrees = append(r.worktrees, v.value)
		case v.section == "core" && v.subsection == "" && v.key == "bare":
			r.bare = r.bare || v.valueless || slices.Contains([]string{"true", "yes", "on", "1"}, strings.ToLower(v.value))
		default:
			if p, ok := gitProgram(v); ok {
				r.uses = append(r.uses, configUse{value: p, why: why})
			}
		}
	}
}

// locate gives the paths a value names: itself when absolute; what "~"
// or "~user" at its start stands for (none when the user is unknown);
// none for git's runtime prefix ("%(prefix)/"), which is no session
// directory's; else the value taken from each of bases.
func (r *configReader) locate(v string, bases []string) []string {
	var paths []string
	switch name, ok := strings.CutPrefix(v, "~"); {
	case filepath.IsAbs(v):
		return []string{v}
	case ok:
		name, rest, _ := strings.Cut(name, "/")
		for _, h := range r.home(name) {
			paths = append(paths, joinConfigPath(h, rest))
		}
	case strings.HasPrefix(v, "%("):
	default:
		for _, b := range bases {
			paths = append(paths, joinConfigPath(b, v))
		}
	}
	return paths
}

// joinConfigPath joins a relative path to dir as the kernel walks it:
// not cleaned, since a ".." after a link leads out of where the link
// points, not back. An absolute path stays as it is.
func joinConfigPath(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return strings.TrimSuffix(dir, "/") + "/" + p
}

// gitProgram returns the program a config variable makes git run, when
// the variable is one git runs as a command (see configTargets) and the
// command's first word is a path.
func gitProgram(v gitConfigVar) (string, bool) {
	if v.valueless || v.value == "" {
		return "", false
	}
	name := v.section + "." + v.key
	if v.subsection != "" {
		name = v.section + ".*." + v.key
	}
	cmd := v.value
	switch name {
	case "core.editor", "core.pager", "core.sshcommand", "core.askpass", "core.gitproxy", "core.alternaterefscommand",
		"sequence.editor", "interactive.difffilter", "diff.external", "diff.*.command", "diff.*.textconv",
		"merge.*.driver", "filter.*.clean", "filter.*.smudge", "filter.*.process",
		"difftool.*.cmd", "mergetool.*.cmd", "browser.*.cmd", "man.*.cmd", "guitool.*.cmd",
		"gpg.program", "gpg.*.program", "gpg.*.defaultkeycommand", "remote.*.uploadpack", "remote.*.receivepack",
		"uploadpack.packobjectshook", "sendemail.tocmd", "sendemail.cccmd", "sendemail.sendmailcmd", "sendemail.smtpserver",
		"imap.tunnel", "hook.*.command", "trailer.*.command", "trailer.*.cmd":
	case "difftool.*.path", "mergetool.*.path", "browser.*.path", "man.*.path":
		return cmd, strings.Contains(cmd, "/") // a path, not a command line
	case "core.fsmonitor":
		if gitBool(v) {
			return "", false
		}
	case "credential.helper", "credential.*.helper", "submodule.*.update":
		rest, bang := strings.CutPrefix(strings.TrimLeft(cmd, " \t"), "!")
		switch {
		case bang:
			cmd = rest
		case v.section == "credential" && filepath.IsAbs(cmd):
			return cmd, true
		default:
			return "", false // a helper or mode git names itself
		}
	default:
		switch {
		case v.section == "pager" && v.subsection == "" && !gitBool(v):
		case v.section == "alias" && strings.HasPrefix(cmd, "!"):
			cmd = cmd[1:]
		default:
			return "", false
		}
	}
	return commandProgram(cmd)
}

// commandProgram returns the first word of a shell command line, when it
// names the program by a path (holds a slash) that can be told without
// running a shell: unquoted, or quoted as the shell does, after any
// VAR=value assignments. An expansion ($, `), a glob or an operator where
// the program would be gives false.
func commandProgram(line string) (string, bool) {
	i := 0
	for {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '\n') {
			i++
		}
		word, n, ok := shellWord(line[i:])
		if !ok || word == "" {
			return "", false
		}
		i += n
		// An assignment before the command: NAME=value.
		if eq := strings.IndexByte(word, '='); eq > 0 && isShellName(word[:eq]) && strings.HasPrefix(line[i-n:], word[:eq+1]) {
			continue
		}
		return word, strings.Contains(word, "/")
	}
}

// shellWord reads one word from the start of s as sh would, quotes
// removed; n is how many bytes it took. A word the shell would expand
// ($, `, a glob) gives false; "~" at its start stays, for the caller to
// expand.
func shellWord(s string) (word string, n int, ok bool) {
	var w strings.Builder
	i := 0
	for i < len(s) {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || strings.IndexByte("|&;<>()", c) >= 0:
			return w.String(), i, true
		case c == '$' || c == '`' || c == '*' || c == '?' || c == '[':
			return "", 0, false
		case c == '\\':
			if i+1 >= len(s) {
				return "", 0, false
			}
			if s[i+1] != '\n' {
				w.WriteByte(s[i+1])
			}
			i += 2
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return "", 0, false
			}
			w.WriteString(s[i+1 : i+1+end])
			i += end + 2
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				switch s[i] {
				case '$', '`':
					return "", 0, false
				case '\\':
					if i+1 < len(s) && strings.IndexByte("$`\"\\\n", s[i+1]) >= 0 {
						i++
						if s[i] == '\n' {
							continue
						}
					}
				}
				w.WriteByte(s[i])
			}
			if i >= len(s) {
				return "", 0, false
			}
			i++
		default:
			w.WriteByte(c)
			i++
		}
	}
	return w.String(), i, true
}

// isShellName reports whether s is a shell variable's name.
func isShellName(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c == '_' || isASCIILetter(c) || i > 0 && isDigit(c)) {
			return false
		}
	}
	return s != ""
}

// homeDirs returns the function configTargets takes: "~" stands for
// sandboxd's own home and that of owner (the uid whose git reads the
// repositories: the session directory's owner), "~name" for that user's.
func homeDirs(owner int) func(string) []string {
	return func(name string) []string {
		var homes []string
		if name != "" {
			if u, err := user.Lookup(name); err == nil && u.HomeDir != "" {
				homes = append(homes, u.HomeDir)
			}
			return homes
		}
		if h, err := os.UserHomeDir(); err == nil {
			homes = append(homes, h)
		}
		if u, err := user.LookupId(fmt.Sprint(owner)); err == nil && u.HomeDir != "" && !slices.Contains(homes, u.HomeDir) {
			homes = append(homes, u.HomeDir)
		}
		return homes
	}
}
