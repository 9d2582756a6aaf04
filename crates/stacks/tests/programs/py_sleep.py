import time, threading
def inner_sleep():
    while True:
        time.sleep(100)
def outer():
    inner_sleep()
def worker():
    outer()
threading.Thread(target=worker, name="sleeper-thread", daemon=True).start()
outer()
