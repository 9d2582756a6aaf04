def busy_inner(n):
    x = 0
    while True:
        x = (x + n) % 1000003
def busy_outer():
    busy_inner(7)
busy_outer()
