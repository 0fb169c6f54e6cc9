/* Library version and build capabilities. */
#include "gpulaunch/gpulaunch.h"

int gpl_version(void) { return GPL_VERSION_CODE; }
