#include "CHTTPShim.h"
#include <microhttpd.h>
int siwa_http_shim_version(void) { return (int)MHD_VERSION; }
