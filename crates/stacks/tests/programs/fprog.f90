program hang
  call level1()
contains
  subroutine level1()
    call level2()
  end subroutine
  subroutine level2()
    call sleep(100)
  end subroutine
end program
