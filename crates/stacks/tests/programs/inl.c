#include <unistd.h>
volatile int sink;
static inline void leaf(void) { for (;;) { sink++; if (sink == -5) sleep(1); } }
static inline void mid(void) { sink = 1; leaf(); }
__attribute__((noinline)) void outer_fn(void) { mid(); sink = 2; }
int main(void) { outer_fn(); return 0; }
