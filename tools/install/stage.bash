# bash completion for stage. Every candidate comes from `stage __complete`,
# which reads the same tables as stage's own parser and asks the daemon for
# its roots, checkpoints and nodes; this only hands over the line and adds
# the file system's completion where stage asks for it ("!dirs", "!files").
_stage()
{
	local cur=${COMP_WORDS[COMP_CWORD]} line paths=""
	local -a out=()

	while IFS= read -r line; do
		case $line in
		'!dirs') paths=1; mapfile -t -O "${#out[@]}" out < <(compgen -d -- "$cur") ;;
		'!files') paths=1; mapfile -t -O "${#out[@]}" out < <(compgen -f -- "$cur") ;;
		*) out+=("$line") ;;
		esac
	done < <("${COMP_WORDS[0]}" __complete "$COMP_CWORD" "${COMP_WORDS[@]}" 2>/dev/null)
	# Paths: a directory gets its '/' and no space after it.
	[ -n "$paths" ] && compopt -o filenames 2>/dev/null
	COMPREPLY=("${out[@]}")
}
complete -F _stage stage
