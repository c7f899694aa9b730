/* Shell completion: `stage __complete CWORD WORD...` prints the candidates
 * for word CWORD of the line WORD..., for tools/install/stage.bash. */
#ifndef STAGE_CLI_COMPLETE_H
#define STAGE_CLI_COMPLETE_H

/* argv[0] is "__complete". Returns the exit code (0, also when there is
 * nothing to offer). */
int cli_complete_main(int argc, char **argv);

#endif
