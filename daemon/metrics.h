/* `stage metrics` and the textfile collector: every counter of the daemon
 * in the Prometheus text format (common/prom.h). There is no HTTP server of
 * our own: node_exporter's textfile collector already serves a directory of
 * *.prom files, so with [metrics] textfile set a thread replaces that file
 * every `interval` seconds (a temporary beside it, then rename, so a scrape
 * reads one whole text), and removes it when the daemon stops, so that a
 * stopped daemon's figures do not pass for live ones (a killed daemon's
 * file stays: node_textfile_mtime_seconds tells its age).
 */
#ifndef STAGE_METRICS_H
#define STAGE_METRICS_H

#include <stddef.h>

#include "common/config.h"
#include "common/prom.h"

/* Everything into p (the caller checks prom_error). */
void metrics_render(const struct stage_config *cfg, struct prom *p);
/* Serves MSG_METRICS_REQ on a control connection: MSG_METRICS slices, then
 * the result. */
void metrics_serve(const struct stage_config *cfg, int fd);
/* With cfg->metrics_textfile set, starts the writer. 0 or -errno (why). */
int metrics_start(const struct stage_config *cfg, char *why, size_t whylen);
void metrics_stop(void);

#endif
