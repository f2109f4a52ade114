sig=$1; known=" $2 "; shift 2; n=0; last=
sess=
for k in $known; do case $k in %*) sess="$sess ${k#%}";; esac; done
pc=/sys/fs/cgroup/pids; [ -r "$pc/pids.max" ] || pc=/sys/fs/cgroup
room() {
  max=; cur=
  { read -r max < "$pc/pids.max"; read -r cur < "$pc/pids.current"; } 2>/dev/null
  case $max in ''|*[!0-9]*) return 0;; esac
  case $cur in ''|*[!0-9]*) return 0;; esac
  [ $((max - cur)) -gt 2 ]
}
pids=" "
look=
if room && command -v grep >/dev/null; then look=$(echo .; exec grep -ls "$@" /proc/[0-9]*/environ); fi
case $look in
.*)
  for f in $look; do case $f in /proc/*/environ) f=${f#/proc/}; pids="$pids${f%/environ} ";; esac; done;;
*)
  for d in /proc/[0-9]*; do
    e=; l=
    { while read -r l; do e="$e$l"; done; e="$e$l"; } 2>/dev/null < "$d/environ"
    for m; do
      case $m in -e) continue;; esac
      case $e in *"$m"*) pids="$pids${d#/proc/} "; break;; esac
    done
  done;;
esac
readstat() {
  st=
  { read -r st; while read -r l; do st="$st $l"; done; } 2>/dev/null < "$1"
}
sids=
tree() {
  links=; reapers=" "
  for d in /proc/[0-9]*; do
    readstat "$d/stat"
    [ -n "$st" ] || continue
    p=${d#/proc/}
    case $st in "$p (docker-init) "?" 0 "*) reapers="$reapers$p ";; esac
    set -- ${st##*) }
    case $1 in Z|X) continue;; esac
    case $known in *" $p:${20} "*) case $pids in *" $p "*) ;; *) pids="$pids$p ";; esac;; esac
    links="$links $p:$2:$4:${20}"
  done
  if [ -z "$sids" ]; then
    sids=" "
    for k in $sess; do
      s=${k%%:*}; t=${k#*:}; ok=1
      [ "$s" -gt 1 ] 2>/dev/null || continue
      for l in $links; do
        case $l in "$s:"*) [ "$t" != 0 ] && [ "${l##*:}" = "$t" ] || ok=0; break;; esac
      done
      [ $ok = 0 ] || sids="$sids$s "
    done
  fi
  grew=1
  while [ $grew = 1 ]; do
    grew=0
    for l in $links; do
      p=${l%%:*}; r=${l#*:}; pp=${r%%:*}; r=${r#*:}; s=${r%%:*}
      case $pids in
      *" $p "*)
        [ "$s" -gt 1 ] || continue
        case $sids in *" $s "*) ;; *) sids="$sids$s "; grew=1;; esac
        continue;;
      esac
      case $pids in *" $pp "*) pids="$pids$p "; grew=1; continue;; esac
      case $sids in *" $s "*) pids="$pids$p "; grew=1;; esac
    done
  done
}
tree
if [ "$sig" != KILL ]; then
  send=
  for p in $pids; do case $reapers in *" $p "*) ;; *) send="$send $p";; esac; done
  [ -z "$send" ] || kill -s "$sig" $send 2>/dev/null
  for s in $sids; do
    t=0
    for l in $links; do case $l in "$s:"*) t=${l##*:}; break;; esac; done
    printf '%%%s:%s ' "$s" "$t"
  done
  for l in $links; do
    case $pids in *" ${l%%:*} "*) printf '%s:%s ' "${l%%:*}" "${l##*:}";; esac
  done
  exit 0
fi
while [ "$pids" != " " ]; do
  kill -s STOP $pids 2>/dev/null
  new=0
  for p in $pids; do case $last in *" $p "*) ;; *) new=1; break;; esac; done
  [ $new = 1 ] || kill -s KILL $pids 2>/dev/null
  n=$((n+1))
  if [ $n -ge 100 ]; then kill -s KILL $pids 2>/dev/null; exit 1; fi
  for l in $links; do
    case $pids in *" ${l%%:*} "*)
      case $known in *" ${l%%:*}:${l##*:} "*) ;; *) known="$known${l%%:*}:${l##*:} ";; esac;;
    esac
  done
  last=$pids; pids=" "
  tree
done
read -r t0 _ < /proc/uptime; t0=${t0%.*}${t0#*.}
reaps=0; readstat /proc/1/stat
case $st in "1 (docker-init) "*|"1 (tini) "*) reaps=1;; esac
for k in $known; do
  case $k in %*) continue;; esac
  while :; do
    readstat "/proc/${k%%:*}/stat"
    [ -n "$st" ] || break
    set -- ${st##*) }
    [ "${20}" = "${k##*:}" ] || break
    [ "$2" != 1 ] || [ $reaps = 1 ] || break
    read -r t _ < /proc/uptime; t=${t%.*}${t#*.}
    [ $((t - t0)) -lt 300 ] || break 2
    if room; then sleep 0.01; fi
  done
done
