/* A library that loads an MPI program's code by a name it reads at run time: the library
 * named by MPI_HELLO_LIBRARY (tests/c/hello.c built as a shared library with Open MPI), whose
 * `mpi_hello_main` it runs. Nothing in the ELF files of a program linked to this library
 * names Open MPI, and the program imports nothing that loads code: rlaunch cannot see that
 * it will be an Open MPI program. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int run_loaded(int argc, char **argv)
{
    const char *path = getenv("MPI_HELLO_LIBRARY");
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
    if (!lib) {
        fprintf(stderr, "loader: cannot load %s: %s\n", path ? path : "(unset)",
                path ? dlerror() : "MPI_HELLO_LIBRARY is not set");
        return 2;
    }
    int (*hello)(int, char **) = (int (*)(int, char **))dlsym(lib, "mpi_hello_main");
    if (!hello) {
        fprintf(stderr, "loader: %s has no mpi_hello_main\n", path);
        return 2;
    }
    return hello(argc, argv);
}
