/* A shared library that exports no ncclNetPlugin_vN table: the loader must WARN, naming this
 * file and the symbols it looked for, and try the next net. */
int fn_not_a_net_plugin(void) { return 42; }
