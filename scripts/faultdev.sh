#!/bin/bash
# faultdev.sh: an nbdkit `sh` plugin serving a file whose reads, writes, flushes, trims and
# zeroes fail on command. Used by the tests as a backing device whose FLUSH fails (nbdkit
# 1.32's error filter never fails a flush) and heals.
#
#   nbdkit -U SOCK sh scripts/faultdev.sh file=IMG control=CTL [log=LOG]
#
# IMG is the device (its size is the export's size). CTL is read at every request; it need
# not exist (no faults). One rule a line, `#` starts a comment:
#
#   OP [from=BYTES] [len=BYTES] [times=N] [errno=NAME] [drop]
#
#   OP        pread | pwrite | flush | trim | zero | write (pwrite, trim and zero) | any
#   from, len requests overlapping [from, from+len) fail (default: the whole device;
#             ignored for flush)
#   times     only the first N matching requests fail, counted since CTL last changed
#             (its contents: to count again, write a different file, e.g. a new comment)
#   errno     the error the client gets (EIO by default; ENOSPC, EROFS, ...)
#   drop      flush only: the failing flush also DISCARDS every write since the last good
#             flush, as Linux does after a writeback error (the pages are marked clean and
#             the error reported once; a later fsync succeeds without them). A cache that
#             then trusts a later successful flush has lost those writes.
#
# Examples: `flush drop` (every flush fails, dropping the unsynced writes, until CTL is
# emptied); `flush times=1 drop`; `pwrite from=4096 len=4096 errno=ENOSPC`.
#
# LOG (optional) gets one line a request: `OP OFFSET COUNT ok|ERRNO` (flush: offset and count
# 0). Writes are kept undoable (a copy of the bytes they replaced, in nbdkit's $tmpdir) until
# the next good flush, so a write-heavy client that never flushes grows $tmpdir.
#
# A fresh process runs each request (the sh plugin's model) and nbdkit serializes all
# requests, so the state kept in $tmpdir needs no locking. Slow (a few ms a request): for
# tests, not benchmarks. Without rules a read costs one `dd`, a write two (its undo copy),
# a flush none beyond the script itself.

set -u -f
# Parameters, as shell assignments written by `config` (sourced: no process per request).
file="" control="" log=""
if [ -f "$tmpdir/cfg" ]; then . "$tmpdir/cfg"; fi

log() {
    if [ -n "$log" ]; then echo "$*" >>"$log"; fi
}

# fails OP OFFSET COUNT: prints the errno (and 1 for `drop`) and returns 0 when a rule fails
# this request, 1 when none does; exits 2 on a malformed control file.
fails() {
    local op=$1 off=$2 count=$3 ctl=$control sum="" n=0 line
    [ -n "$ctl" ] && [ -s "$ctl" ] || return 1
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        line=${line%%#*}
        set -- $line
        [ $# -gt 0 ] || continue
        local rop=$1 from=0 len=-1 times=-1 errno=EIO drop=""
        shift
        for a in "$@"; do
            case $a in
            from=*) from=${a#from=} ;;
            len=*) len=${a#len=} ;;
            times=*) times=${a#times=} ;;
            errno=*) errno=${a#errno=} ;;
            drop) drop=1 ;;
            *)
                echo "EINVAL faultdev: $ctl line $n: unknown word '$a'" >&2
                exit 2
                ;;
            esac
        done
        case $rop in
        any) ;;
        write) case $op in pwrite | trim | zero) ;; *) continue ;; esac ;;
        pread | pwrite | flush | trim | zero) [ "$rop" = "$op" ] || continue ;;
        *)
            echo "EINVAL faultdev: $ctl line $n: unknown op '$rop'" >&2
            exit 2
            ;;
        esac
        if [ "$op" != flush ]; then
            [ $((off + count)) -gt "$from" ] || continue
            [ "$len" -lt 0 ] || [ "$off" -lt $((from + len)) ] || continue
        fi
        if [ "$times" -ge 0 ]; then
            # (The checksum only when a rule counts: a process fewer per request.)
            if [ -z "$sum" ]; then
                sum=$(cksum <"$ctl")
                sum=${sum// /_}
            fi
            local cf="$tmpdir/count.$sum.$n" used
            used=0
            if [ -f "$cf" ]; then read -r used <"$cf"; fi
            [ "$used" -lt "$times" ] || continue
            echo $((used + 1)) >"$cf"
        fi
        echo "$errno $drop"
        return 0
    done <"$ctl"
    return 1
}

# Before bytes [OFF, OFF+COUNT) change: keeps what they hold until the next good flush.
save_undo() {
    local off=$1 count=$2 seq=0 name
    [ -d "$tmpdir/undo" ] || mkdir "$tmpdir/undo"
    if [ -f "$tmpdir/seq" ]; then read -r seq <"$tmpdir/seq"; fi
    seq=$((seq + 1))
    echo $seq >"$tmpdir/seq"
    printf -v name %012d.%s "$seq" "$off"
    dd if="$file" of="$tmpdir/undo/$name" bs=64K \
        iflag=skip_bytes,count_bytes skip="$off" count="$count" status=none
}

# A failed flush with `drop`: puts back what every write since the last good flush replaced,
# newest first.
drop_unsynced() {
    local f off
    [ -d "$tmpdir/undo" ] || return 0
    for f in $(ls "$tmpdir/undo" | sort -r); do
        off=${f#*.}
        dd if="$tmpdir/undo/$f" of="$file" bs=64K oflag=seek_bytes seek="$off" \
            conv=notrunc status=none
    done
    rm -rf "$tmpdir/undo"
}

# check OP OFFSET COUNT: exits with the rule's error if one fails this request.
check() {
    local r rc=0
    # No rules (the common case): no subshell.
    [ -n "$control" ] && [ -s "$control" ] || return 0
    r=$(fails "$@") || rc=$?
    # A control file it cannot read fails every request (named on stderr by `fails`).
    [ $rc -ne 2 ] || exit 1
    if [ $rc -eq 0 ]; then
        set -- "$@" $r
        log "$1 $2 $3 $4"
        if [ "$1" = flush ] && [ "${5:-}" = 1 ]; then
            drop_unsynced
        fi
        echo "$4 faultdev: injected $1 error at byte $2 (+$3)" >&2
        exit 1
    fi
}

# Arguments: METHOD HANDLE COUNT OFFSET FLAGS (pread, pwrite, trim, zero), METHOD HANDLE (flush).
case "$1" in
load) : >"$tmpdir/cfg" ;;
config)
    case $2 in
    file | control | log) printf '%s=%q\n' "$2" "$3" >>"$tmpdir/cfg" ;;
    *)
        echo "faultdev: unknown parameter $2 (file=, control=, log=)" >&2
        exit 1
        ;;
    esac
    ;;
config_complete)
    if [ ! -f "$file" ]; then
        echo "faultdev: file=IMG (an existing file) is required" >&2
        exit 1
    fi
    ;;
open) echo h ;;
get_size) stat -L -c %s "$file" ;;
can_write | can_flush | can_trim | can_zero | can_multi_conn) exit 0 ;;
can_fua) echo emulate ;;
is_rotational | can_extents | can_fast_zero) exit 3 ;;
can_cache) echo none ;;
pread)
    check pread "$4" "$3"
    dd if="$file" bs=64K iflag=skip_bytes,count_bytes skip="$4" count="$3" status=none
    log pread "$4" "$3" ok
    ;;
pwrite)
    check pwrite "$4" "$3"
    save_undo "$4" "$3"
    dd of="$file" bs=64K iflag=fullblock,count_bytes oflag=seek_bytes seek="$4" \
        count="$3" conv=notrunc status=none
    log pwrite "$4" "$3" ok
    ;;
trim | zero)
    check "$1" "$4" "$3"
    save_undo "$4" "$3"
    # Reads of a trimmed range return zeroes (the file plugin's behaviour on tmpfs).
    fallocate -p -o "$4" -l "$3" "$file" 2>/dev/null ||
        head -c "$3" /dev/zero | dd of="$file" bs=64K iflag=fullblock oflag=seek_bytes \
            seek="$4" conv=notrunc status=none
    log "$1" "$4" "$3" ok
    ;;
flush)
    check flush 0 0
    if [ -d "$tmpdir/undo" ]; then rm -rf "$tmpdir/undo"; fi
    log flush 0 0 ok
    ;;
*) exit 2 ;;
esac
