/* The `stage codec` container's header and trailer, shared by its writer
 * and reader only. docs/CODEC.md has the layout. */
#ifndef STAGE_CODEC_FILE_H
#define STAGE_CODEC_FILE_H

#define CODEC_FILE_MAGIC   "STGC"
#define CODEC_FILE_END     "STGE"
#define CODEC_FILE_VERSION 1
#define CODEC_FILE_HDR     16
#define CODEC_FILE_TRAILER 32

#endif
