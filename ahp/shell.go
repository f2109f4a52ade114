package ahp

// ShellIntegration is the bash script injected into every terminal's shell
// as its rc file. It marks prompts (OSC 633 A and B). From PS0, which bash
// expands once for each command line it read and is about to run, whatever
// the line starts with, and never for an empty one, it sends the command
// line and its start (E, then C); at every prompt, the exit code of the
// last command (D: sandboxd takes it only for a command that started) and
// the working directory (P;Cwd=). These four carry the terminal's nonce as
// their last argument, so that a program's output cannot forge them.
// shellLauncher sets __sbx_nonce before it runs; a bash without PS0 (before
// 4.4) drops it, and so gets no command detection.
const ShellIntegration = `HISTCONTROL=
HISTFILE=
((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 404)) || __sbx_nonce=
__sbx_esc() {
	local s=${1//\\/\\\\}
	s=${s//;/\\x3b}
	s=${s//$'\n'/\\x0a}
	s=${s//$'\e'/\\x1b}
	s=${s//$'\a'/\\x07}
	s=${s//$'\x18'/\\x18}
	s=${s//$'\x1a'/\\x1a}
	s=${s//$'\xc2\x9c'/\\xc2\\x9c}
	s=${s//$'\xc2\x9d'/\\xc2\\x9d}
	__sbx_escaped=$s
}
__sbx_prompt() {
	local code=$? __sbx_escaped
	__sbx_esc "$PWD"
	printf '\033]633;D;%s;%s\007\033]633;P;Cwd=%s;%s\007' "$code" "$__sbx_nonce" "$__sbx_escaped" "$__sbx_nonce"
	return $code
}
__sbx_preexec() {
	local line __sbx_escaped
	line=$(HISTTIMEFORMAT= builtin history 1)
	[[ $line =~ ^[[:space:]]*[0-9]+[*[:space:]]+(.*)$ ]] && line=${BASH_REMATCH[1]}
	__sbx_esc "${line:0:4096}"
	printf '\033]633;E;%s;%s\007\033]633;C;%s\007' "$__sbx_escaped" "$__sbx_nonce" "$__sbx_nonce"
}
PS0='$(__sbx_preexec)'
PS1='\[\033]633;A\007\]\w\$ \[\033]633;B\007\]'
PROMPT_COMMAND=__sbx_prompt
`

// shellLauncher starts bash with ShellIntegration as its rc file when the
// image has bash, and a plain sh otherwise (no command detection then).
// The script comes in the environment; the nonce never does, nor in any
// argument, which any process of the user may read in /proc: the launcher
// turns the terminal's echo off, says so with OSC 633 R;nonce, reads the
// nonce that sandboxd then types, turns echo on and says R;ready; only
// then does a client's input go in. (A process of the user that reads the
// terminal itself can take the nonce, as it can any keystroke.) R;none
// says no nonce is wanted: no bash, or no stty to keep it off the screen.
// BASH_ENV is emptied so that no script of the image reads the input
// first, and readline reads the image's /etc/inputrc (or none), not the
// ~/.inputrc in HOME, /tmp, which any command may write: a macro there
// could have the shell print its nonce. (A process of the user may still
// read the shell's memory, as it may read the terminal: command detection
// is not proof against the session's own commands, see docs/ahp.md.)
const shellLauncher = `if command -v bash >/dev/null 2>&1; then
	BASH_ENV= exec bash -c '
		rc=$SANDBOXD_SHELL_INTEGRATION
		unset SANDBOXD_SHELL_INTEGRATION
		nonce=
		if stty -echo 2>/dev/null; then
			printf "\033]633;R;nonce\007"
			IFS= read -r nonce
			stty echo
			case $nonce in
			*[!0-9a-f]*|"") nonce=- ;;
			esac
			printf "\033]633;R;ready\007"
		else
			printf "\033]633;R;none\007"
		fi
		inputrc=/etc/inputrc
		[ -r "$inputrc" ] || inputrc=/dev/null
		INPUTRC=$inputrc exec bash --noprofile --rcfile <(printf "__sbx_nonce=%s\n%s" "$nonce" "$rc") -i'
fi
unset SANDBOXD_SHELL_INTEGRATION
printf '\033]633;R;none\007'
exec sh -i`
