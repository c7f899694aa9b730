/* One version for the daemon, the client and the protocol docs. */
#ifndef STAGE_VERSION_H
#define STAGE_VERSION_H

#define STAGE_VERSION "0.2.0"

#endif
