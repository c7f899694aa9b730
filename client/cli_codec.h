/* `stage codec compress|decompress|bench` (BRIEF §3): local, no daemon. */
#ifndef STAGE_CLI_CODEC_H
#define STAGE_CLI_CODEC_H

/* argv[0] is "codec"; options may stand anywhere after it. Returns the
 * exit code (enum cli_exit). */
int cli_codec_main(int argc, char **argv);

#endif
