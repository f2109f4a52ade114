package ahp

// ShellIntegration is the bash script injected into every terminal's shell
// as its rc file. It marks prompts (OSC 633 A and B), the command line and
// its start (E, then C), its end with the exit code (D) and the working
// directory (P;Cwd=), each of the last four with the terminal's nonce as
// its last argument, so that a program's output cannot forge them.
// shellLauncher sets __sbx_nonce before it runs.
const ShellIntegration = `HISTCONTROL=
HISTFILE=
__sbx_ready=0
__sbx_running=0
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
	printf '%s' "$s"
}
__sbx_prompt() {
	local code=$?
	if [ "$__sbx_running" = 1 ]; then
		printf '\033]633;D;%s;%s\007' "$code" "$__sbx_nonce"
		__sbx_running=0
	fi
	printf '\033]633;P;Cwd=%s;%s\007' "$(__sbx_esc "$PWD")" "$__sbx_nonce"
	__sbx_ready=1
	return $code
}
__sbx_preexec() {
	[ "$__sbx_ready" = 1 ] || return
	case $BASH_COMMAND in __sbx_*) return ;; esac
	__sbx_ready=0
	local line
	line=$(HISTTIMEFORMAT= builtin history 1)
	[[ $line =~ ^[[:space:]]*[0-9]+[*[:space:]]+(.*)$ ]] && line=${BASH_REMATCH[1]}
	printf '\033]633;E;%s;%s\007\033]633;C;%s\007' "$(__sbx_esc "$line")" "$__sbx_nonce" "$__sbx_nonce"
	__sbx_running=1
}
PS1='\[\033]633;A\007\]\w\$ \[\033]633;B\007\]'
PROMPT_COMMAND=__sbx_prompt
trap '__sbx_preexec' DEBUG
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
// read the shell's memory, as it may read the terminal.)
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
