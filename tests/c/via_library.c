/* A program that reaches MPI only through a library: it calls `mpi_hello_main`, which is
 * tests/c/hello.c built into a shared library of its own with Open MPI (`-Dmain=...`). The
 * program itself links no MPI library and imports nothing that loads or starts programs, so
 * only the library's own dependencies show that it needs PMIx. */
int mpi_hello_main(int argc, char **argv);

int main(int argc, char **argv)
{
    return mpi_hello_main(argc, argv);
}
